// ZeRO stage 1 (Rajbhandari et al.): the optimizer state of a stage is sharded across its
// data-parallel replicas. Every replica still holds all parameters and the averaged gradients;
// each updates only the parameters it owns and then sends them to the others.
//
// The shards are whole parameters (DeepSpeed flattens and cuts at element boundaries; whole
// tensors keep every optimizer's per-parameter state intact and make the per-layer
// checkpoint files shard-free), assigned greedily by size so the shards stay within one
// parameter of each other.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "pipetrain/comm/group.h"

namespace pipetrain {

class ZeroPartition {
 public:
  ZeroPartition() = default;
  // Deterministic from the shapes alone, so every replica of a stage computes the same one.
  // ConfigError for replicas < 1 or a replica index outside [0, replicas).
  ZeroPartition(const std::vector<torch::Tensor>& params, int replicas, int replica);
  // By given sizes: a tensor-parallel slice counts as its full tensor, so every rank of a
  // tensor-parallel group assigns its slices to the same replicas.
  ZeroPartition(const std::vector<int64_t>& sizes, int replicas, int replica);

  int replicas() const { return replicas_; }
  // Index of the replica updating params[i].
  int owner(size_t i) const { return owner_.at(i); }
  // The parameters of `params` (the list given to the constructor) this replica updates.
  std::vector<torch::Tensor> owned(const std::vector<torch::Tensor>& params) const;
  // Elements each replica owns.
  const std::vector<int64_t>& shard_numel() const { return shard_numel_; }

  // After the owners' optimizer step: every replica receives the parameters it does not own
  // (one broadcast per owner over the data-parallel group, whose i-th member is replica i).
  void gather(comm::Group& data_parallel, const std::vector<torch::Tensor>& params) const;

 private:
  int replicas_ = 1;
  int replica_ = 0;
  std::vector<int> owner_;
  std::vector<int64_t> shard_numel_;
};

// Bytes of the tensors an optimizer keeps per parameter (momentum, Adam's moments, ...).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace pipetrain
