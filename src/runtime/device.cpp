// The device shim: no-ops on CPU.
#include "pipetrain/runtime/device.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cctype>

#include "pipetrain/error.h"

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

torch::Device resolve_device(const std::string& setting, int local_rank, int64_t cuda_devices,
                             int local_world_size) {
  if (cuda_devices < 0) cuda_devices = static_cast<int64_t>(torch::cuda::device_count());
  const auto local_cuda = [&] {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(std::max(local_rank, 0) % cuda_devices));
  };
  if (setting == "auto") return cuda_devices > 0 ? local_cuda() : torch::Device(torch::kCPU);
  if (setting == "cpu") return torch::kCPU;
  if (setting == "cuda" || setting.rfind("cuda:", 0) == 0) {
    if (cuda_devices == 0) {
      throw DeviceError("device \"" + setting + "\" was asked for but " +
                        (torch::cuda::is_available() || cuda_devices > 0 ? std::string("no CUDA device is visible")
                                                                         : std::string("this LibTorch has no CUDA")) +
                        "; use \"auto\" or \"cpu\", or build against a CUDA LibTorch on a machine with a GPU");
    }
    if (setting == "cuda") return local_cuda();
    const std::string index = setting.substr(5);
    const bool digits = !index.empty() && index.size() < 6 &&
                        std::all_of(index.begin(), index.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits) {
      throw ConfigError("device \"" + setting + "\": expected cuda:N with N a device index, e.g. cuda:0");
    }
    const int64_t n = std::stoll(index);
    if (local_world_size > 1) {
      throw ConfigError(fmt::format(
          "device \"{}\" would put all {} processes of this host on one GPU; use \"cuda\" (rank r takes "
          "cuda:(r mod {})), or give each process its own setting",
          setting, local_world_size, cuda_devices));
    }
    if (n >= cuda_devices) {
      throw DeviceError("device \"" + setting + "\" does not exist: " + std::to_string(cuda_devices) +
                        " CUDA device(s) are visible (cuda:0 to cuda:" + std::to_string(cuda_devices - 1) + ")");
    }
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(n));
  }
  throw ConfigError("unknown device \"" + setting + "\"; expected auto, cpu, cuda or cuda:N");
}

}  // namespace pipetrain::runtime
