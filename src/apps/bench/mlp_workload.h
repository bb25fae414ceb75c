// The standard benchmark workloads "mlp" and "mlp-4" of shared/bench/WORKLOADS.md: the model
// with its exact initialisation stream, the fixed batch, and their pipeline layouts.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "pipetrain/engine/pipeline_module.h"

namespace pipetrain::apps {

struct MlpWorkload {
  std::string name;               // "mlp" or "mlp-4"
  int stages = 2;                 // the workload's pipeline layout
  int micro_batches = 8;
  std::vector<torch::Tensor> weights;  // 16 Linear(1024, 1024), drawn as WORKLOADS.md says
  std::vector<torch::Tensor> biases;
  torch::Tensor x;  // 256 x 1024
  torch::Tensor y;
  static constexpr int kLinears = 16;
  static constexpr int64_t kWidth = 1024;
  static constexpr int64_t kRows = 256;
  static constexpr double kLr = 0.01;
  // GEMM FLOPs of one training step (47 products of 256x1024x1024).
  static constexpr double kFlopsPerStep = 47.0 * 2.0 * 256 * 1024 * 1024;
};

// The workload's weights, biases, x and y (data::mlp_workload(), drawn once per process in
// WORKLOADS.md's order) and its layout. ConfigError for a name other than "mlp" or "mlp-4".
MlpWorkload make_mlp_workload(const std::string& name);

// The model as layer specs whose modules start from the workload's weights (whatever seed
// the engine gives each layer), and the MSE loss.
PipelineModule mlp_pipeline_module(const MlpWorkload& workload);

// The plain model (a Sequential) with the workload's weights.
torch::nn::Sequential mlp_sequential(const MlpWorkload& workload);

}  // namespace pipetrain::apps
