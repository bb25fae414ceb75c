// Megatron-LM's tensor-parallel layers, each cut from the full layer as one process would build
// it, so a model split over T ranks starts from exactly the weights of the model in one process
// (and a checkpoint of either loads into the other: runtime/tensor_parallel.h records the cuts).
//
//   ColumnParallelLinear  W [out, in] split by rows: each rank computes out/T outputs of the
//                         whole input (f before: the input gradient is all-reduced)
//   RowParallelLinear     W [out, in] split by columns: each rank takes in/T inputs (a column
//                         layer's output) and the partial products are all-reduced (g); the
//                         bias is added once, after the sum
//   VocabParallelEmbedding rows of the vocabulary split; ids outside a rank's rows give zeros and
//                         the all-reduce assembles the embedding
//
// With a group of size 1 they hold the whole layer and compute exactly what it computes.
#pragma once

#include <torch/torch.h>

#include "pipetrain/runtime/tensor_parallel.h"

namespace pipetrain::runtime {

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // `stride` > 1: the outputs are `stride` blocks (q, k, v of a fused projection) and each rank
  // takes its part of every block, so the blocks stay aligned on every rank.
  ColumnParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup group, int64_t stride = 1,
                           bool gather_output = false);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  TensorParallelGroup group;
  bool gather_output;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup group);
  torch::Tensor forward(const torch::Tensor& x);  // x: this rank's in/T input columns
  torch::Tensor weight, bias;
  TensorParallelGroup group;
};
TORCH_MODULE(RowParallelLinear);

class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(const torch::nn::Embedding& full, TensorParallelGroup group);
  torch::Tensor forward(const torch::Tensor& ids);
  // This rank's vocabulary rows [vocab_begin, vocab_begin + weight.size(0)).
  torch::Tensor weight;
  int64_t vocab_begin = 0;
  TensorParallelGroup group;
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace pipetrain::runtime
