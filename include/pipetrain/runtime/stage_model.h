// One model chunk of a stage: its layers, run with the Linear fast path and activation
// checkpointing every N layers (DeepSpeed's activation_checkpoint_interval).
#pragma once

#include "pipetrain/runtime/rng.h"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/partition/layer_spec.h"
#include "pipetrain/runtime/deferred_linear.h"
#include "pipetrain/runtime/gemm.h"
#include "pipetrain/skip/plan.h"

namespace pipetrain::runtime {

struct StageModelOptions {
  // Plain Linear layers take the DeferredLinear path: backward computes the input gradient
  // and backward_weight() the weight gradients of several micro-batches in one product.
  bool deferred_linear = true;
  GemmKernel gemm_kernel = GemmKernel::Blas;
  // Checkpoint every N layers (0 = off): only each group's input is kept, the group is
  // recomputed in backward with the RNG state of its forward.
  int64_t checkpoint_interval = 0;
  // The whole model's skips (layer indices of the model, not of the chunk); null: none.
  std::shared_ptr<const skip::SkipPlan> skips;
};

class StageModel {
 public:
  StageModel(BuiltLayers layers, StageModelOptions options);

  // Runs the chunk on micro-batch `mb`. With grad mode on, the result carries the graph back
  // to `input`; Linear layers on the fast path keep their input and upstream gradient under
  // `mb` until backward_weight({mb, ...}).
  //
  // Skips: `tracker` holds the tensors this chunk pops from earlier chunks when it is called
  // and the ones it stashes for later chunks when it returns (runtime/skip_range.h).
  Batch forward(const Batch& input, int64_t mb, skip::SkipTracker& tracker);
  // The same with a tracker of its own: for chunks whose skips stay inside.
  Batch forward(const Batch& input, int64_t mb);

  // Weight gradients of the fast-path Linear layers for these micro-batches, fused. The other
  // layers' parameter gradients are computed by autograd in backward, as usual.
  void backward_weight(const std::vector<int64_t>& mbs);
  // A group of weight gradients that may pause when `pause()` says the stage has more urgent
  // work; returns true when it paused. Only the native accumulator pauses (its pieces give the
  // same bits whenever they run, DeferredLinear), and it runs only up to the group's
  // micro-batches: what is left stays queued, for fill_weight_gradients(), later groups or
  // finish_weight_groups(). Other products run in full, as grouped.
  bool backward_weight_group(const std::vector<int64_t>& mbs, const std::function<bool()>& pause);
  // One bounded piece of queued weight-gradient work (a stage waiting for a message calls it
  // until the message is there); false when nothing is queued.
  bool fill_weight_gradients();
  // Every weight gradient whose backward ran is in .grad (before the optimizer step).
  void finish_weight_groups();
  bool has_deferred_weights() const { return !deferred_.empty(); }
  // Some layer queues its weight work in the native accumulator (DeferredLinear).
  bool accumulates_natively() const;
  // The squared norm of `param`'s gradient where a fast-path layer's kernel computed it
  // (DeferredLinear::weight_grad_sqnorm: `param` is that layer's weight); none otherwise.
  std::optional<double> weight_grad_sqnorm(const torch::Tensor& param) const;

  // The weights changed in place (optimizer step, checkpoint load): refresh cached copies.
  void weights_changed();
  // DeferredLinear::prepare_backward on every fast-path layer.
  void prepare_backward();
  // Drops every kept tensor (after a failed step).
  void clear();

  std::vector<torch::Tensor> parameters() const { return layers_.parameters(); }
  const BuiltLayers& layers() const { return layers_; }
  BuiltLayers& layers() { return layers_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.modules.size()); }
  int64_t num_deferred_linear() const { return static_cast<int64_t>(deferred_.size()); }
  void train(bool on);

  // What this chunk's forwards drew from the default generator (the executor's leases).
  DrawHistory& draws() { return draws_; }

 private:
  Batch run_range(int64_t first, int64_t last, const Batch& input, int64_t mb);

  DrawHistory draws_;

  BuiltLayers layers_;
  StageModelOptions options_;
  // Per local layer: its fast path, or null.
  std::vector<std::unique_ptr<DeferredLinear>> fast_;
  std::vector<DeferredLinear*> deferred_;
};

}  // namespace pipetrain::runtime
