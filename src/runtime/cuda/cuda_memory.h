// CUDA allocator statistics; compiled only where LibTorch has CUDA (PIPETRAIN_WITH_CUDA).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace pipetrain::runtime::detail {

// The peak of bytes allocated on CUDA device `index` (all pools), as torch.cuda.max_memory_allocated.
int64_t cuda_peak_allocated_bytes(c10::DeviceIndex index);
// Starts the peak over from what is allocated now, as torch.cuda.reset_peak_memory_stats.
void cuda_reset_peak(c10::DeviceIndex index);

}  // namespace pipetrain::runtime::detail
