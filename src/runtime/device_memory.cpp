// Device memory statistics: the CUDA allocator's where this LibTorch has CUDA, none elsewhere.
#include "pipetrain/runtime/device.h"

#include <torch/cuda.h>

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

void reset_peak_device_memory(torch::Device device) {
#ifdef PIPETRAIN_WITH_CUDA
  if (device.is_cuda()) detail::cuda_reset_peak(device.index());
#endif
}

void synchronize_device(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace pipetrain::runtime
