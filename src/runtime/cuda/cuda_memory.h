// CUDA allocator statistics; compiled only where LibTorch has CUDA (PIPETRAIN_WITH_CUDA).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace pipetrain::runtime::detail {

// The peak of bytes allocated on CUDA device `index` (all pools), as torch.cuda.max_memory_allocated.
int64_t cuda_peak_allocated_bytes(c10::DeviceIndex index);

}  // namespace pipetrain::runtime::detail
