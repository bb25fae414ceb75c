// The device shim: the few device operations the pipeline needs, no-ops on CPU.
//
// The same pipeline code runs on CPU (our CI) and CUDA. On CPU a "device guard" does nothing
// and a copy between partitions on one device is skipped (the autograd graph simply runs on).
// On CUDA the guard makes a worker's kernels go to its partition's device, and a copy is a
// differentiable `to(device)`, so gradients flow back across devices.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"

namespace pipetrain::runtime {

// Makes `device` current for the scope (c10's device-generic guard; nothing on CPU).
class DeviceScope {
 public:
  explicit DeviceScope(torch::Device device);

 private:
  c10::OptionalDeviceGuard guard_;
};

// The batch on `device`: the same tensors when they are there already, else differentiable
// copies. Non-floating tensors are copied too (they carry no gradient).
Batch copy_to(const Batch& batch, torch::Device device);

// Every CUDA device, or one CPU device per partition when there is none.
std::vector<torch::Device> default_devices(int64_t partitions);

// A process's device from a setting (the engine's pipeline.device):
//   "auto"    cuda:<local_rank % CUDA devices> where CUDA is available, else cpu
//   "cpu"     the CPU
//   "cuda"    cuda:<local_rank % CUDA devices>
//   "cuda:N"  that device
// DeviceError when CUDA is asked for and absent, or N is not a device; ConfigError for any
// other text, and for "cuda:N" shared by the `local_world_size` > 1 processes of a host (every
// rank would land on one GPU: "cuda" gives each its own). `cuda_devices` < 0 asks LibTorch how
// many there are.
torch::Device resolve_device(const std::string& setting, int local_rank, int64_t cuda_devices = -1,
                             int local_world_size = 1);

// Peak bytes the caching allocator has held on `device` since the process started; nullopt
// where there are no such statistics (the CPU, or a LibTorch built without CUDA).
std::optional<int64_t> peak_device_memory_bytes(torch::Device device);
// Starts that peak over from what is held now (nothing on the CPU).
void reset_peak_device_memory(torch::Device device);

// Waits until the work queued on `device` is done (nothing on the CPU, whose ops are done when
// they return): host timings of GPU work are only right after it.
void synchronize_device(torch::Device device);

}  // namespace pipetrain::runtime
