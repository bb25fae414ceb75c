// The c10d types that differ between LibTorch 1.13 and 2.x, named once for the comm layer.
//
// 1.13: ProcessGroupGloo / ProcessGroupNCCL derive from c10d::ProcessGroup and run the
// operations. 2.x splits that class: c10d::ProcessGroup became a front end that dispatches to
// c10d::Backend subclasses, and ProcessGroupGloo / ProcessGroupNCCL are Backends. pipetrain
// drives the Gloo and NCCL classes directly, so it holds them by the class that runs the
// operations in each version: their send, recv, allreduce, broadcast and barrier are the same.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <type_traits>
#include <utility>

namespace pipetrain::comm::detail {

#if TORCH_VERSION_MAJOR >= 2
using ProcessGroupBase = c10d::Backend;
#else
using ProcessGroupBase = c10d::ProcessGroup;
#endif
using ProcessGroupPtr = c10::intrusive_ptr<ProcessGroupBase>;

// 2.x's TCPStore asks for its libuv server by default (TCPStoreOptions::useLibUV), which a
// LibTorch built without libuv (Debian's) refuses at run time; the plain socket server exists
// in every version and serves a rendezvous of a few hundred ranks.
template <typename Options, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename Options>
struct HasUseLibUV<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>> : std::true_type {};

template <typename Options>
void use_plain_socket_store(Options& options) {
  if constexpr (HasUseLibUV<Options>::value) options.useLibUV = false;
}

}  // namespace pipetrain::comm::detail
