// The LibTorch types that differ between 1.13 and 2.x, named once for the runtime layer.
#pragma once

#include <c10/core/Allocator.h>

namespace pipetrain::runtime::detail {

// The type of an argument of a member function, read off the declaration this LibTorch has.
template <typename F, int N>
struct ArgumentOf;
template <typename C, typename R, typename A0, typename A1, typename A2, typename A3, typename A4>
struct ArgumentOf<R (C::*)(A0, A1, A2, A3, A4), 2> {
  using type = A2;
};

// MemoryReportingInfoBase::reportMemoryUsage's totals: int64_t in 1.13, size_t in 2.x.
using MemoryTotal = typename ArgumentOf<decltype(&c10::MemoryReportingInfoBase::reportMemoryUsage), 2>::type;

}  // namespace pipetrain::runtime::detail
