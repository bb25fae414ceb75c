// CUDA allocator statistics (see cuda_memory.h).
#include "cuda_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>

namespace pipetrain::runtime::detail {

int64_t cuda_peak_allocated_bytes(c10::DeviceIndex index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  // StatType::AGGREGATE, the first entry in every version; 2.x moved the enum to another
  // namespace (c10::CachingDeviceAllocator), so it is not named here.
  constexpr size_t kAggregate = 0;
  return stats.allocated_bytes[kAggregate].peak;
}

void cuda_reset_peak(c10::DeviceIndex index) { c10::cuda::CUDACachingAllocator::resetPeakStats(index); }

}  // namespace pipetrain::runtime::detail
