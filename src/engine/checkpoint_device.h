// Where a checkpoint's tensors load: onto the device of the module they load into (map_location),
// never the device that saved them (a GPU the reader may not have, or another rank's).
#pragma once

#include <torch/torch.h>

namespace pipetrain::detail {

// The device of the module's first parameter, else of its first buffer; the CPU for a module
// that holds neither (nothing of it can land anywhere else).
inline c10::Device checkpoint_load_device(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.device();
  for (const auto& b : module.buffers()) return b.device();
  return c10::Device(c10::kCPU);
}

}  // namespace pipetrain::detail
