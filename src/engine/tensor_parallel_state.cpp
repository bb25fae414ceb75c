// Full tensors for the checkpoint of a tensor-parallel layer, and the cut after loading one.
#include "tensor_parallel_state.h"

#include "optimizer_compat.h"

namespace pipetrain::detail {
namespace {

torch::optim::OptimizerParamState* state_of(torch::optim::Optimizer* optimizer, const torch::Tensor& p) {
  if (!optimizer) return nullptr;
  auto it = optimizer->state().find(optimizer_state_key(p));
  return it == optimizer->state().end() ? nullptr : it->second.get();
}

}  // namespace

void map_optimizer_state(torch::optim::OptimizerParamState& state,
                         const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  auto apply = [&](const torch::Tensor& t) { return t.defined() ? fn(t) : t; };
  if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    a->exp_avg(apply(a->exp_avg()));
    a->exp_avg_sq(apply(a->exp_avg_sq()));
    a->max_exp_avg_sq(apply(a->max_exp_avg_sq()));
  } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    w->exp_avg(apply(w->exp_avg()));
    w->exp_avg_sq(apply(w->exp_avg_sq()));
    w->max_exp_avg_sq(apply(w->max_exp_avg_sq()));
  } else if (auto* m = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    m->momentum_buffer(apply(m->momentum_buffer()));
  } else if (auto* r = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    r->square_avg(apply(r->square_avg()));
    r->momentum_buffer(apply(r->momentum_buffer()));
    r->grad_avg(apply(r->grad_avg()));
  } else if (auto* g = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    g->sum(apply(g->sum()));
  }
}

FullTensors::FullTensors(const torch::nn::Module& module, const runtime::TensorParallelGroup& group,
                         torch::optim::Optimizer* optimizer)
    : optimizer_(optimizer) {
  if (!group.active()) return;
  torch::NoGradGuard no_grad;
  for (auto p : module.parameters()) {
    const auto layout = runtime::shard_layout(p);
    if (!layout) continue;
    auto gather = [&](const torch::Tensor& t) { return runtime::gather_shards(t.detach(), *layout, group); };
    auto full = gather(p);
    if (auto* state = state_of(optimizer, p)) map_optimizer_state(*state, gather);
    p.set_data(full);
    swapped_.emplace_back(p, *layout);
  }
}

FullTensors::~FullTensors() {
  torch::NoGradGuard no_grad;
  for (auto& [p, layout] : swapped_) {
    const auto& l = layout;
    auto cut = [&l](const torch::Tensor& t) { return l.slice(t); };
    if (auto* state = state_of(optimizer_, p)) map_optimizer_state(*state, cut);
    p.set_data(cut(p.detach()));
  }
}

void cut_loaded_shards(const torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  torch::NoGradGuard no_grad;
  for (auto p : module.parameters()) {
    const auto layout = runtime::shard_layout(p);
    if (!layout || p.size(layout->dim) != layout->full_size) continue;
    const auto& l = *layout;
    auto cut = [&l](const torch::Tensor& t) { return l.slice(t); };
    if (auto* state = state_of(optimizer, p)) map_optimizer_state(*state, cut);
    p.set_data(cut(p.detach()));
  }
}

}  // namespace pipetrain::detail
