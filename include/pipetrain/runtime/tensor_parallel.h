// Tensor (model) parallelism as Megatron-LM does it: the ranks of a tensor-parallel group each
// hold a slice of a layer's weights and meet in an all-reduce or all-gather inside its forward
// and backward. This file holds the group a layer talks to, the communication as autograd
// functions (Megatron's f and g), the record of which parameters are slices of what, and the
// vocabulary-parallel cross-entropy. The layers are in runtime/parallel_layers.h.
//
// Layers are built inside a TensorParallelScope (PipelineEngine sets it from its topology) and
// keep the group they were built under; without one the group has size 1 and every function
// here is the plain single-process operation, so the same model definition runs both ways.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "pipetrain/comm/group.h"
#include "pipetrain/runtime/rng.h"

namespace pipetrain::runtime {

struct TensorParallelGroup {
  std::shared_ptr<comm::Group> group;  // null when size == 1
  int rank = 0;
  int size = 1;
  // The stream of sharded regions (ShardedRandomScope): this rank's own, so that the ranks
  // holding different attention heads drop different probabilities (Megatron's model-parallel
  // RNG). Undefined for a group of 1, where every region is the whole and draws as one process.
  at::Generator sharded_rng;
  bool active() const { return size > 1; }
};

// The sharded-region stream of tensor-parallel rank `rank` when the run's seed is `seed` (the
// same on every rank): a different stream per rank, never the replicated one.
at::Generator make_sharded_generator(uint64_t seed, int rank);

// Random ops inside the scope that draw through current_generator() (runtime::Dropout) draw
// from the current group's sharded stream, installed as the thread's task generator: use it
// around what only this rank's slice sees (attention probabilities of its heads, a
// column-parallel activation). Outside it every rank of the group draws the same (replicated
// activations must stay equal). Ops that draw from the default generator directly
// (torch::dropout) draw the replicated stream even inside. No-op without a sharded stream.
// Activation checkpoints (runtime/checkpoint.h) replay the sharded stream on recomputation.
class ShardedRandomScope {
 public:
  ShardedRandomScope();
  ShardedRandomScope(const ShardedRandomScope&) = delete;
  ShardedRandomScope& operator=(const ShardedRandomScope&) = delete;

 private:
  std::optional<TaskGeneratorScope> scope_;
};

// The group of this thread (set by the innermost TensorParallelScope), size 1 outside any.
const TensorParallelGroup& current_tensor_parallel();

class TensorParallelScope {
 public:
  explicit TensorParallelScope(TensorParallelGroup group);
  ~TensorParallelScope();
  TensorParallelScope(const TensorParallelScope&) = delete;
  TensorParallelScope& operator=(const TensorParallelScope&) = delete;

 private:
  TensorParallelGroup saved_;
};

// How a parameter (or buffer) is a slice of a full tensor: along `dim` the full size is cut into
// `stride` equal chunks (3 for a fused q/k/v weight), and rank r holds part r of each chunk,
// the parts of a chunk as even as integers allow (Megatron's partition_stride).
struct ShardLayout {
  int64_t dim = 0;
  int64_t full_size = 0;
  int64_t stride = 1;
  int rank = 0;
  int size = 1;
  // [begin, end) of this rank's part of chunk `c`, in the full tensor's coordinates.
  std::pair<int64_t, int64_t> range(int64_t chunk) const { return range_of(rank, chunk); }
  std::pair<int64_t, int64_t> range_of(int r, int64_t chunk) const;
  // This rank's slice of `full` (the parts of every chunk, concatenated).
  torch::Tensor slice(const torch::Tensor& full) const;
};

// Records that `param` is a slice. Parameters not recorded are replicated across the group (they
// see the same input and get the same gradient on every rank).
void mark_sharded(const torch::Tensor& param, const ShardLayout& layout);
std::optional<ShardLayout> shard_layout(const torch::Tensor& param);

// The full tensor from every rank's slice `part` (collective over the group; no autograd).
torch::Tensor gather_shards(const torch::Tensor& part, const ShardLayout& layout, const TensorParallelGroup& group);

// Megatron's f: identity forward, all-reduce (sum) of the gradient backward. Before a
// column-parallel layer: every rank's slice of the output depends on the whole input.
torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& group);
// Megatron's g: all-reduce (sum) forward, identity backward. After a row-parallel layer.
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& group);
// All-gather along the last dimension forward (rank order, even parts), this rank's part of the
// gradient backward.
torch::Tensor gather_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& group);

// Cross-entropy over a vocabulary split across the group: `logits` [N, V_part] hold this rank's
// columns (rows [begin, end) of the vocabulary, `vocab_begin` = begin), `targets` [N] full
// vocabulary indices. Returns the per-row loss [N], the same on every rank; never gathers the
// logits (Megatron's vocab_parallel_cross_entropy). Size 1: torch's cross_entropy, unreduced.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_begin, const TensorParallelGroup& group);

}  // namespace pipetrain::runtime
