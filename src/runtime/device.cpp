// The device shim: no-ops on CPU.
#include "pipetrain/runtime/device.h"

#include <torch/cuda.h>

namespace pipetrain::runtime {

DeviceScope::DeviceScope(torch::Device device) {
  if (!device.is_cpu()) guard_.reset_device(device);
}

Batch copy_to(const Batch& batch, torch::Device device) {
  bool moved = false;
  std::vector<torch::Tensor> out;
  out.reserve(batch.size());
  for (const auto& t : batch.tensors()) {
    if (t.device() == device) {
      out.push_back(t);
    } else {
      out.push_back(t.to(device));
      moved = true;
    }
  }
  return moved ? batch.with(std::move(out)) : batch;
}

std::vector<torch::Device> default_devices(int64_t partitions) {
  std::vector<torch::Device> devices;
  const auto cuda = static_cast<int64_t>(torch::cuda::device_count());
  if (cuda > 0) {
    for (int64_t d = 0; d < cuda; ++d) {
      devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(d));
    }
  } else {
    for (int64_t j = 0; j < partitions; ++j) devices.emplace_back(torch::kCPU);
  }
  return devices;
}

}  // namespace pipetrain::runtime
