// CUDA allocator statistics (see cuda_memory.h).
#include "cuda_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>

namespace pipetrain::runtime::detail {

int64_t cuda_peak_allocated_bytes(c10::DeviceIndex index) {
  using c10::cuda::CUDACachingAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
}

}  // namespace pipetrain::runtime::detail
