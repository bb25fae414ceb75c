// A stage's model chunk: layers in order, Linear fast path, checkpointed groups.
#include "pipetrain/runtime/stage_model.h"

#include <algorithm>

#include "pipetrain/runtime/skip_range.h"

namespace pipetrain::runtime {

namespace {

// A layer can take the fast path when it is a plain, untied Linear that runs its own forward:
// a tied or customised use may do anything with the module.
torch::nn::Linear plain_linear(const LayerSpec& spec, torch::nn::AnyModule& module) {
  if (spec.tied() || spec.forward) return nullptr;
  auto impl = module.ptr();
  auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(impl);
  if (!linear) return nullptr;
  return torch::nn::Linear(linear);
}

}  // namespace

StageModel::StageModel(BuiltLayers layers, StageModelOptions options)
    : layers_(std::move(layers)), options_(options) {
  fast_.resize(layers_.modules.size());
  if (!options_.deferred_linear) return;
  for (size_t i = 0; i < layers_.modules.size(); ++i) {
    auto linear = plain_linear(layers_.specs[i], layers_.modules[i]);
    if (!linear) continue;
    fast_[i] = std::make_unique<DeferredLinear>(linear, options_.gemm_kernel);
    deferred_.push_back(fast_[i].get());
  }
}

Batch StageModel::run_range(int64_t first, int64_t last, const Batch& input, int64_t mb) {
  Batch x = input;
  for (int64_t i = first; i < last; ++i) {
    if (fast_[i] && x.atomic()) {
      x = Batch(fast_[i]->forward(x.tensor(), mb));
    } else {
      x = layers_.forward_layer(static_cast<size_t>(i), x);
    }
  }
  return x;
}

Batch StageModel::forward(const Batch& input, int64_t mb, skip::SkipTracker& tracker) {
  static const skip::SkipPlan no_skips;
  const skip::SkipPlan& plan = options_.skips ? *options_.skips : no_skips;
  const int64_t n = num_layers();
  const int64_t interval = options_.checkpoint_interval;
  const bool groups = interval > 0 && torch::GradMode::is_enabled();
  const int64_t group = groups ? interval : std::max<int64_t>(n, 1);
  Batch x = input;
  for (int64_t first = 0; first < n; first += group) {
    const int64_t last = std::min(n, first + group);
    auto run = [this, first, last, mb](const Batch& in) { return run_range(first, last, in, mb); };
    x = run_with_skips(plan, layers_.begin + first, layers_.begin + last, x, tracker, groups, run);
  }
  return x;
}

Batch StageModel::forward(const Batch& input, int64_t mb) {
  skip::SkipTracker tracker;
  return forward(input, mb, tracker);
}

void StageModel::backward_weight(const std::vector<int64_t>& mbs) {
  for (auto* d : deferred_) d->backward_weight(mbs);
}

bool StageModel::backward_weight_group(const std::vector<int64_t>& mbs, const std::function<bool()>& pause) {
  // Products that are not pieces of an accumulator must run as the group asked, now.
  for (auto* d : deferred_) {
    if (!d->has_queued_weight_work()) d->backward_weight(mbs);
  }
  // The accumulator's queue up to the group's micro-batches, a row block at a time; work
  // queued after them is left to the next wait (filling it) or to a later group.
  for (auto* d : deferred_) {
    if (!d->has_queued_weight_work()) continue;
    while (d->has_queued_weight_work_of(mbs)) {
      if (pause && pause()) return true;  // the rest stays queued, for waits or the step's end
      d->accumulate_some_of(mbs);
    }
    d->backward_weight(mbs);
  }
  return false;
}

bool StageModel::fill_weight_gradients() {
  for (auto* d : deferred_) {
    // Two micro-batches of one row block: ~0.2 ms on a 1024-feature layer, the most a
    // message that arrives meanwhile waits.
    if (d->accumulate_some(2)) return true;
  }
  return false;
}

bool StageModel::accumulates_natively() const {
  return std::any_of(deferred_.begin(), deferred_.end(), [](const DeferredLinear* d) { return d->accumulates_natively(); });
}

std::optional<double> StageModel::weight_grad_sqnorm(const torch::Tensor& param) const {
  for (const auto* d : deferred_) {
    if (d->layer()->weight.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return d->weight_grad_sqnorm();
  }
  return {};
}

void StageModel::finish_weight_groups() {
  for (auto* d : deferred_) d->accumulate_all();
}

void StageModel::weights_changed() {
  for (auto* d : deferred_) d->weights_changed();
}

void StageModel::prepare_backward() {
  for (auto* d : deferred_) d->prepare_backward();
}

void StageModel::clear() {
  for (auto* d : deferred_) d->clear();
}

void StageModel::train(bool on) {
  for (auto& m : layers_.modules) m.ptr()->train(on);
}

}  // namespace pipetrain::runtime
