// ZeRO-1 shards: which replica updates which parameter, and the all-gather after the step.
#include "pipetrain/engine/zero_partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "pipetrain/error.h"

namespace pipetrain {

namespace {

std::vector<int64_t> sizes_of(const std::vector<torch::Tensor>& params) {
  std::vector<int64_t> sizes;
  for (const auto& p : params) sizes.push_back(p.numel());
  return sizes;
}

}  // namespace

ZeroPartition::ZeroPartition(const std::vector<torch::Tensor>& params, int replicas, int replica)
    : ZeroPartition(sizes_of(params), replicas, replica) {}

ZeroPartition::ZeroPartition(const std::vector<int64_t>& sizes, int replicas, int replica)
    : replicas_(replicas), replica_(replica) {
  if (replicas < 1 || replica < 0 || replica >= replicas) {
    throw ConfigError(fmt::format("ZeRO partition: replica {} of {} replicas does not exist", replica, replicas));
  }
  // Largest first onto the lightest shard (ties: the lower index), then the order is
  // forgotten: owner_ is by the caller's index.
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  owner_.assign(sizes.size(), 0);
  shard_numel_.assign(static_cast<size_t>(replicas), 0);
  for (size_t i : order) {
    const auto lightest = std::min_element(shard_numel_.begin(), shard_numel_.end()) - shard_numel_.begin();
    owner_[i] = static_cast<int>(lightest);
    shard_numel_[static_cast<size_t>(lightest)] += sizes[i];
  }
}

std::vector<torch::Tensor> ZeroPartition::owned(const std::vector<torch::Tensor>& params) const {
  if (params.size() != owner_.size()) {
    throw UsageError(fmt::format("ZeRO partition of {} parameters asked about {}", owner_.size(), params.size()));
  }
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (owner_[i] == replica_) out.push_back(params[i]);
  }
  return out;
}

void ZeroPartition::gather(comm::Group& data_parallel, const std::vector<torch::Tensor>& params) const {
  if (replicas_ < 2) return;
  if (data_parallel.size() != replicas_ || params.size() != owner_.size()) {
    throw UsageError(fmt::format("ZeRO gather over {} ranks of {} parameters; the partition has {} replicas and {}",
                                 data_parallel.size(), params.size(), replicas_, owner_.size()));
  }
  torch::NoGradGuard no_grad;
  for (int r = 0; r < replicas_; ++r) {
    std::vector<torch::Tensor> shard;
    for (size_t i = 0; i < params.size(); ++i) {
      if (owner_[i] == r) shard.push_back(params[i]);
    }
    if (shard.empty()) continue;
    data_parallel.broadcast(shard, data_parallel.ranks().at(static_cast<size_t>(r)),
                            fmt::format("ZeRO-1 parameters of replica {}", r));
  }
}

namespace {

int64_t bytes(const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto* s = state.get();
    if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      total += bytes(a->exp_avg()) + bytes(a->exp_avg_sq()) + bytes(a->max_exp_avg_sq());
    } else if (const auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      total += bytes(w->exp_avg()) + bytes(w->exp_avg_sq()) + bytes(w->max_exp_avg_sq());
    } else if (const auto* m = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      total += bytes(m->momentum_buffer());
    } else if (const auto* r = dynamic_cast<const torch::optim::RMSpropParamState*>(s)) {
      total += bytes(r->square_avg()) + bytes(r->momentum_buffer()) + bytes(r->grad_avg());
    } else if (const auto* g = dynamic_cast<const torch::optim::AdagradParamState*>(s)) {
      total += bytes(g->sum());
    }
  }
  return total;
}

}  // namespace pipetrain
