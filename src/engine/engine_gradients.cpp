// PipelineEngine: the end of a step. Tied and data-parallel gradient reduction, the global
// norm and clipping, the non-finite check and the optimizer step with its learning rate.
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <set>

#include "pipetrain/engine/optimizer.h"
#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/error.h"
#include "pipetrain/util/log.h"

namespace pipetrain {

namespace {

// The gradients a collective sums: every trainable parameter's, zeros where this rank's part of
// the model gave it none. Frozen ones are left out (their gradients would be zeros that weight
// decay and momentum then act on).
std::vector<torch::Tensor> defined_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (auto p : params) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace

void PipelineEngine::on_step_op(schedule::Op op, const runtime::StageStepResult& so_far) {
  switch (op) {
    case schedule::Op::reduce_tied_grads:
      reduce_tied_grads();
      break;
    case schedule::Op::reduce_grads:
      reduce_data_parallel_grads();
      break;
    case schedule::Op::optimizer_step:
      optimizer_step(so_far);
      break;
    default:
      break;
  }
}

void PipelineEngine::sync_initial_weights() {
  torch::NoGradGuard no_grad;
  // Tied copies start as the lowest stage's (which built the module at its first use, as a
  // model in one process does); replicas start as replica 0's.
  for (auto& t : tied_) {
    auto group = groups_.tied_group(t.key);
    if (group && group->size() > 1) group->broadcast(t.params, group->ranks().front(), "tied weights " + t.key);
  }
  if (num_replicas() > 1) {
    auto params = parameters();
    groups_.data_parallel->broadcast(params, groups_.data_parallel->ranks().front(), "initial weights");
    parameters_changed();
  }
}

void PipelineEngine::reduce_tied_grads() {
  for (auto& t : tied_) {
    auto group = groups_.tied_group(t.key);
    if (!group || group->size() < 2) continue;
    auto grads = defined_grads(t.params);
    group->all_reduce(grads, comm::ReduceOp::Sum, "gradients of tied layer " + t.key);
  }
}

void PipelineEngine::reduce_data_parallel_grads() {
  if (num_replicas() < 2) return;
  auto grads = defined_grads(trainable_parameters());
  groups_.data_parallel->all_reduce(grads, comm::ReduceOp::Avg, fmt::format("gradients of stage {}", stage()));
}

double PipelineEngine::local_grad_sqnorm() const {
  // Each parameter counts once in the pipeline: a tied module only on its lowest stage.
  std::set<const void*> skip, tied;
  for (const auto& t : tied_) {
    for (const auto& p : t.params) {
      tied.insert(p.unsafeGetTensorImpl());
      if (!t.counts_in_norm) skip.insert(p.unsafeGetTensorImpl());
    }
  }
  // The fast-path layers' kernels summed their gradients' squares as they wrote them. A
  // collective may have written a gradient since, into its memory without a version bump, so
  // those sums count only where none ran: one replica, no tensor parallelism, no tied copy.
  const bool kernel_sums = num_replicas() == 1 && tensor_parallel_size() == 1;
  double sum = 0;
  // The other gradients' squares, summed where they are: one read-back per step, not one per
  // parameter (each would make the host wait for a GPU).
  torch::Tensor on_device;
  for (const auto& p : trainable_parameters()) {
    if (!p.grad().defined() || skip.count(p.unsafeGetTensorImpl())) continue;
    // A tensor-parallel slice counts on every rank of the group, a replicated parameter once.
    if (tensor_rank() != 0 && !runtime::shard_layout(p)) continue;
    if (kernel_sums && !tied.count(p.unsafeGetTensorImpl())) {
      std::optional<double> known;
      for (const auto& chunk : chunks_) {
        if ((known = chunk->weight_grad_sqnorm(p))) break;
      }
      if (known) {
        sum += *known;
        continue;
      }
    }
    // One pass in the gradient's own precision (cascade-summed): an upcast copy costs more
    // than the optimizer step on a stage of 1024x1024 layers.
    const torch::Tensor n = p.grad().detach().norm().to(torch::kDouble);
    on_device = on_device.defined() ? on_device + n * n : n * n;
  }
  if (on_device.defined()) sum += on_device.item<double>();
  return sum;
}

void PipelineEngine::clear_grads() {
  for (auto p : parameters()) p.mutable_grad() = torch::Tensor();
}

void PipelineEngine::optimizer_step(const runtime::StageStepResult& so_far) {
  torch::NoGradGuard no_grad;
  const double replicas = static_cast<double>(num_replicas());
  // The ranks of a tensor-parallel group share the loss: the first speaks for them.
  const double loss_part = so_far.losses > 0 && tensor_rank() == 0
                               ? so_far.loss_sum / static_cast<double>(so_far.losses) / replicas
                               : 0.0;
  // Replicas hold equal gradients after the data-parallel average: replica 0 speaks for all.
  const double sqnorm = replica() == 0 ? local_grad_sqnorm() : 0.0;
  const bool bad = !std::isfinite(loss_part) || !std::isfinite(sqnorm);
  // One collective for the three numbers every rank needs.
  auto stats = torch::tensor({loss_part, bad ? 1.0 : 0.0, sqnorm}, torch::kDouble);
  std::vector<torch::Tensor> v{stats};
  comm_->world().all_reduce(v, comm::ReduceOp::Sum, "loss and gradient norm");
  const double loss = stats[0].item<double>();
  const bool nonfinite = stats[1].item<double>() > 0;
  const double norm = std::sqrt(stats[2].item<double>());
  ++global_steps_;
  last_.step = global_steps_;
  last_.loss = loss;
  last_.grad_norm = norm;
  if (scaler_) {
    // fp16: gradients carry the loss scale. An overflow on any rank (agreed by the sum above)
    // skips the step everywhere and lowers the scale; otherwise the scale comes off here.
    last_.loss_scale = scaler_->scale();
    if (nonfinite) {
      if (comm_->rank() == 0) {
        util::log_warn(fmt::format("step {}: fp16 gradients overflow at loss scale {}; step skipped",
                                   global_steps_, scaler_->scale()));
      }
      scaler_->update(true);
      last_.skipped = true;
      last_.grad_norm = NAN;
      clear_grads();
      return;
    }
    const double unscale = 1.0 / scaler_->scale();
    for (auto& p : parameters()) {
      if (p.grad().defined()) p.mutable_grad().mul_(unscale);
    }
    last_.grad_norm = norm * unscale;
    scaler_->update(false);
  }
  if (nonfinite) {
    if (config_.pipeline.on_nonfinite_loss == "error") {
      throw NumericError(fmt::format(
          "step {}: the loss ({}) or the gradient norm ({}) is not finite; lower the learning rate, "
          "clip gradients (\"gradient_clipping\"), or set pipeline.on_nonfinite_loss to \"skip\"",
          global_steps_, loss, norm));
    }
    if (comm_->rank() == 0) {
      util::log_warn(fmt::format("step {}: non-finite loss ({}) or gradient norm ({}); step skipped",
                                 global_steps_, loss, norm));
    }
    last_.skipped = true;
    clear_grads();
    return;
  }
  const double clip = config_.gradient_clipping;
  if (clip > 0 && last_.grad_norm > clip) {
    const double coef = clip / (last_.grad_norm + 1e-6);
    for (auto& p : parameters()) {
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
  }
  last_.lr = config_.scheduler.lr_at(global_steps_ - 1 - scheduler_start_, base_lr_);
  if (optimizer_) {
    set_learning_rate(*optimizer_, last_.lr);
    optimizer_->step();
  }
  // ZeRO-1: each replica stepped its own shard; the others' arrive here.
  if (zero_.replicas() > 1) zero_.gather(*groups_.data_parallel, trainable_parameters());
  parameters_changed();
}

}  // namespace pipetrain
