// Device memory statistics: the CUDA allocator's where this LibTorch has CUDA, none elsewhere.
#include "pipetrain/runtime/device.h"

#ifdef PIPETRAIN_WITH_CUDA
#include "cuda/cuda_memory.h"
#endif

namespace pipetrain::runtime {

std::optional<int64_t> peak_device_memory_bytes(torch::Device device) {
#ifdef PIPETRAIN_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_peak_allocated_bytes(device.index());
#endif
  return std::nullopt;
}

}  // namespace pipetrain::runtime
