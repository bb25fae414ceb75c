// Column-, row- and vocabulary-parallel layers cut from their full layers.
#include "pipetrain/runtime/parallel_layers.h"

#include <fmt/format.h>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

// Registers this rank's slice of `full` as parameter `name` and records the cut.
torch::Tensor register_slice(torch::nn::Module& m, const char* name, const torch::Tensor& full, int64_t dim,
                             int64_t stride, const TensorParallelGroup& g) {
  ShardLayout layout;
  layout.dim = dim;
  layout.full_size = full.size(dim);
  layout.stride = stride;
  layout.rank = g.rank;
  layout.size = g.size;
  auto p = m.register_parameter(name, layout.slice(full.detach()).clone());
  if (g.active()) mark_sharded(p, layout);
  return p;
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup g,
                                                   int64_t stride, bool gather)
    : group(std::move(g)), gather_output(gather) {
  const int64_t out = full->weight.size(0);
  if (out % stride != 0 || out / stride < group.size) {
    throw ConfigError(fmt::format("a column-parallel Linear of {} outputs in {} blocks cannot be split over {} "
                                 "tensor-parallel ranks; use a tensor-parallel size of at most {}",
                                 out, stride, group.size, out / stride));
  }
  weight = register_slice(*this, "weight", full->weight, 0, stride, group);
  if (full->bias.defined()) bias = register_slice(*this, "bias", full->bias, 0, stride, group);
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  auto y = torch::nn::functional::linear(copy_to_tensor_parallel(x, group), weight, bias);
  return gather_output ? gather_from_tensor_parallel(y, group) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup g)
    : group(std::move(g)) {
  const int64_t in = full->weight.size(1);
  if (in < group.size) {
    throw ConfigError(fmt::format("a row-parallel Linear of {} inputs cannot be split over {} tensor-parallel ranks",
                                 in, group.size));
  }
  weight = register_slice(*this, "weight", full->weight, 1, 1, group);
  // Replicated: added once to the reduced sum.
  if (full->bias.defined()) bias = register_parameter("bias", full->bias.detach().clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  auto y = reduce_from_tensor_parallel(torch::matmul(x, weight.t()), group);
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::nn::Embedding& full, TensorParallelGroup g)
    : group(std::move(g)) {
  const int64_t vocab = full->weight.size(0);
  if (vocab < group.size) {
    throw ConfigError(fmt::format("a vocabulary of {} cannot be split over {} tensor-parallel ranks", vocab,
                                 group.size));
  }
  weight = register_slice(*this, "weight", full->weight, 0, 1, group);
  vocab_begin = vocab * group.rank / group.size;
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  if (!group.active()) return torch::embedding(weight, ids);
  const int64_t rows = weight.size(0);
  const auto outside = (ids < vocab_begin) | (ids >= vocab_begin + rows);
  const auto local = (ids - vocab_begin).masked_fill(outside, 0);
  auto y = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_tensor_parallel(y, group);
}

}  // namespace pipetrain::runtime
