// The benchmark workload "mlp" of bench/WORKLOADS.md: its initial weights and its data.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace pipetrain::data {

inline constexpr int64_t kMlpLinears = 16;  // each followed by a ReLU: 32 layers
inline constexpr int64_t kMlpWidth = 1024;
inline constexpr int64_t kMlpRows = 256;
inline constexpr int64_t kMlpMicroBatches = 8;

// Exactly WORKLOADS.md's stream: torch::manual_seed(0); 16 x (Linear(1024, 1024), ReLU) with
// LibTorch's default initialisation (weight, then bias); x = randn(256, 1024); y = randn(...).
struct MlpWorkload {
  std::vector<torch::Tensor> weights;  // [1024, 1024] each, Linear i = layer 2i
  std::vector<torch::Tensor> biases;   // [1024] each
  torch::Tensor x, y;                  // [256, 1024]
};

// Computed once per process on first use and shared (about 66 MB). The global generator's
// state is saved before and restored after, so calling this never disturbs other seeding.
const MlpWorkload& mlp_workload();

}  // namespace pipetrain::data
