// The device shim: the few device operations the pipeline needs, no-ops on CPU.
//
// The same pipeline code runs on CPU (our CI) and CUDA. On CPU a "device guard" does nothing
// and a copy between partitions on one device is skipped (the autograd graph simply runs on).
// On CUDA the guard makes a worker's kernels go to its partition's device, and a copy is a
// differentiable `to(device)`, so gradients flow back across devices.
#pragma once

#include <torch/torch.h>

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

}  // namespace pipetrain::runtime
