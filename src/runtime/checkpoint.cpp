// Activation checkpointing as a custom autograd node (see the picture in checkpoint.h).
#include "pipetrain/runtime/checkpoint.h"

#include <optional>

#include "differentiable.h"
#include "pipetrain/runtime/autocast.h"
#include "pipetrain/runtime/rng.h"
#include "pipetrain/runtime/tensor_parallel.h"

namespace pipetrain::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local bool checkpointing_ = false;
thread_local bool recomputing_ = false;

// Sets a thread-local flag for a scope and puts the previous value back.
class FlagScope {
 public:
  FlagScope(bool& flag, bool value) : flag_(flag), previous_(flag) { flag_ = value; }
  ~FlagScope() { flag_ = previous_; }

 private:
  bool& flag_;
  bool previous_;
};

using detail::differentiable;

// What the node keeps besides the inputs: the function and the RNG state at forward.
struct CheckpointState : torch::CustomClassHolder {
  std::function<Tensors(const Tensors&)> fn;
  at::Generator task_generator;  // copy of the thread's task generator at forward, if any
  RngSnapshot default_rng;       // the default generators at forward, when there was none
  at::Generator sharded_rng;     // copy of the tensor-parallel group's sharded stream at forward
  std::vector<bool> requires_grad;
  AutocastState autocast;  // recomputation runs in the forward's precision, as torch's checkpoint
};


struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& /*phony*/,
                               at::TensorList inputs, c10::intrusive_ptr<CheckpointState> state) {
    Tensors in(inputs.begin(), inputs.end());
    for (const auto& x : in) state->requires_grad.push_back(x.requires_grad() && differentiable(x));
    state->autocast = AutocastState::current();
    // Every random op must draw the same again on recomputation: runtime::Dropout draws from
    // the task generator (copied), every other op from the default generators (captured). A
    // thread whose draws nothing covers leases the default generator for the forward, so
    // that no other thread draws between the capture and the forward's own draws.
    std::optional<DefaultGeneratorLease> lease;
    if (!default_generator_covered()) lease.emplace();
    if (has_task_generator()) state->task_generator = clone_generator(current_generator());
    const auto& sharded = current_tensor_parallel().sharded_rng;
    if (sharded.defined()) state->sharded_rng = clone_generator(sharded);
    // In a task known to draw nothing from the CPU generator there is nothing of it to replay
    // (and it moves under other threads' leases meanwhile); the device generators are saved
    // always (checkpoint_rng_snapshot).
    std::optional<RngSnapshot> before = checkpoint_rng_snapshot();
    Tensors out;
    {
      FlagScope flag(checkpointing_, true);
      NoCastCacheScope no_cache;
      out = state->fn(in);
    }
    // Kept only where something drew (5 KB a checkpoint otherwise, next to the inputs).
    if (before && before->moved_since()) state->default_rng = std::move(*before);
    lease.reset();
    Tensors non_differentiable;
    for (const auto& y : out) {
      if (!differentiable(y)) non_differentiable.push_back(y);
    }
    ctx->mark_non_differentiable(non_differentiable);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(in);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    Tensors inputs;
    inputs.reserve(saved.size());
    for (size_t k = 0; k < saved.size(); ++k) {
      torch::Tensor x = saved[k].detach();
      x.set_requires_grad(state->requires_grad[k]);
      inputs.push_back(std::move(x));
    }

    Tensors outputs;
    {
      FlagScope flag(recomputing_, true);
      torch::AutoGradMode grad_on(true);
      // A fresh copy each time, so a second backward (retain_graph) draws the same again.
      TaskGeneratorScope task_rng(state->task_generator.defined() ? clone_generator(state->task_generator)
                                                                  : at::Generator());
      // The default CPU generator as it was at forward, lent to this thread as a stream: when a
      // tensor-parallel collective inside suspends the lease (rng.h), another rank recomputing
      // meanwhile finds the generator's own state, and each gets its own back at the end.
      std::optional<DefaultGeneratorLease> lease;
      if (state->default_rng.cpu.defined()) {
        lease.emplace(generator_with_state(state->default_rng.cpu));
      } else {
        lease.emplace();
      }
      // Sharded regions inside draw from a copy of their stream as it was at forward; the
      // group's own stream stays where the forwards left it.
      std::optional<TensorParallelScope> sharded_replay;
      if (state->sharded_rng.defined()) {
        TensorParallelGroup replay = current_tensor_parallel();
        replay.sharded_rng = clone_generator(state->sharded_rng);
        sharded_replay.emplace(std::move(replay));
      }
      // Backward may run with autocast off (and on another thread for CUDA): the recomputed
      // activations must be the forward's, in its dtype.
      AutocastStateScope autocast(state->autocast);
      NoCastCacheScope no_cache;
      // The CUDA generators (the CPU one is the lease's).
      const RngSnapshot now = RngSnapshot::capture();
      state->default_rng.restore_cuda();
      try {
        outputs = state->fn(inputs);
      } catch (...) {
        now.restore_cuda();
        throw;
      }
      now.restore_cuda();
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(), "checkpointed function returned ",
                outputs.size(), " tensors on recomputation but ", grad_outputs.size(),
                " at forward; it must be deterministic in its structure");

    variable_list roots, grads;
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (grad_outputs[k].defined() && outputs[k].requires_grad()) {
        roots.push_back(outputs[k]);
        grads.push_back(grad_outputs[k]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    variable_list result;
    result.reserve(inputs.size() + 2);
    result.emplace_back();  // phony
    for (size_t k = 0; k < inputs.size(); ++k) {
      result.push_back(state->requires_grad[k] ? inputs[k].grad() : torch::Tensor());
    }
    result.emplace_back();  // state
    return result;
  }
};

}  // namespace

Tensors checkpointed_forward(const std::function<Tensors(const Tensors&)>& fn,
                             const Tensors& inputs) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  // The phony makes the node executable even when no input requires grad (see the header).
  torch::Tensor phony = torch::empty({0}, torch::TensorOptions().requires_grad(true));
  return CheckpointFunction::apply(phony, at::TensorList(inputs), std::move(state));
}

bool is_checkpointing() { return checkpointing_; }
bool is_recomputing() { return recomputing_; }

}  // namespace pipetrain::runtime
