// Per-layer checkpoints of tensor-parallel layers hold the full tensors, so they load under any
// tensor-parallel size (and in one process): a save gathers each slice and its optimizer state
// into the full tensor for the moment of writing; a load takes the full tensors and cuts this
// rank's slice out again.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "pipetrain/runtime/tensor_parallel.h"

namespace pipetrain::detail {

// Applies `fn` to every tensor the optimizer keeps for one parameter (momentum, Adam's
// moments, ...), replacing it with the result.
void map_optimizer_state(torch::optim::OptimizerParamState& state,
                         const std::function<torch::Tensor(const torch::Tensor&)>& fn);

// While alive, the sharded parameters of `module` (and their state in `optimizer`, when given)
// are the full tensors. Collective over the group, in parameter order on every rank.
class FullTensors {
 public:
  FullTensors(const torch::nn::Module& module, const runtime::TensorParallelGroup& group,
              torch::optim::Optimizer* optimizer);
  ~FullTensors();
  FullTensors(const FullTensors&) = delete;
  FullTensors& operator=(const FullTensors&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, runtime::ShardLayout>> swapped_;
  torch::optim::Optimizer* optimizer_;
};

// After loading full tensors into `module` (and `optimizer`): this rank's slices of them.
void cut_loaded_shards(const torch::nn::Module& module, torch::optim::Optimizer* optimizer);

}  // namespace pipetrain::detail
