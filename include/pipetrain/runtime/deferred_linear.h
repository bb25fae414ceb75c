// The engine's fast path for Linear layers: backward computes only the input gradient, and
// the weight gradients of several micro-batches are computed later in one fused product.
//
//   forward(mb)          y = x W^T + b             keeps x            (per micro-batch)
//   backward_input(mb)   dx = dy W                 keeps dy           (autograd, per micro-batch)
//   backward_weight(mbs) dW += [dy_i]^T [x_i], db += sum dy_i         (one product for all mbs)
//
// This is the split a zero-bubble schedule needs (Qi et al., 2024), and it is also faster for
// every schedule: one 256-row product instead of eight 32-row ones, and no per-micro-batch
// read-modify-write of a weight-sized gradient.
//
// On the native kernel the weight gradient is one accumulator that micro-batches enter in the
// order their input gradients ran, in row blocks that can each stop and resume anywhere
// (native_weight_grad): backward_weight() brings every block up to the micro-batches asked
// for, and accumulate_some() moves one block forward, which a stage does while it waits for a
// message. However the work is cut, every gradient element is the same chain of float
// operations, so the result does not depend on the timing. On the other kernels (and for
// inputs the native kernel does not take) backward_weight(mbs) is one product per call, as asked.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "pipetrain/runtime/gemm.h"
#include "pipetrain/runtime/small_gemm.h"
#include "pipetrain/runtime/small_gemm_bf16.h"

namespace pipetrain::runtime {

class DeferredLinear {
 public:
  DeferredLinear(torch::nn::Linear layer, GemmKernel kernel);

  // y = x W^T + b for x of shape (..., in). With grad mode on, keeps x under `mb` and returns
  // an output whose backward computes dx only and keeps dy under `mb`. Under autocast (bf16 or
  // fp16 compute) x and W are taken in that dtype. In bf16 on the native kernel where the CPU
  // has AVX512_BF16 (small_gemm_bf16.h) the products are pipetrain's, the bias is added in
  // float32, and the weight gradient goes through the native accumulator in float32 like a
  // float32 one; otherwise they are LibTorch's, and the weight gradient of a group of
  // micro-batches is one low-precision product added to the float32 .grad.
  torch::Tensor forward(const torch::Tensor& x, int64_t mb);

  // Adds the weight (and bias) gradients of micro-batches `mbs` to the parameters' .grad; each
  // of them must have run forward and backward. Forgets them afterwards.
  void backward_weight(const std::vector<int64_t>& mbs);
  // One row block of the native accumulator takes in the next micro-batches whose backward
  // ran, `max_micro_batches` of them at most (0: all); false when there is nothing to do.
  // Bounded work (a block is 1/8 of a 1024-feature layer), for filling a wait.
  bool accumulate_some(size_t max_micro_batches = 0);
  // The same for a group: one row block takes in the queued micro-batches up to the last of
  // `mbs` in the order (not beyond, where a later wait can take them); false when every block
  // is there already.
  bool accumulate_some_of(const std::vector<int64_t>& mbs);
  bool has_queued_weight_work_of(const std::vector<int64_t>& mbs) const;
  // Every micro-batch whose backward ran is in the gradient (native accumulator and groups).
  void accumulate_all();
  // Whether accumulate_some() has work.
  bool has_queued_weight_work() const;

  // Whether float32 inputs take the native accumulator (so weight work queues and can fill
  // waits, StageModel::fill_weight_gradients); inputs of other dtypes still take the products.
  bool accumulates_natively() const { return !frozen() && native_eligible(layer_->weight); }

  // A weight or bias with requires_grad false (a frozen embedding, LoRA's base weights): the
  // layer runs as plain autograd, which gives the trainable ones their gradients, and keeps
  // nothing for backward_weight; a deferred dW would give the frozen weight a gradient.
  bool frozen() const;

  // The sum of squares of W's gradient as the native accumulator left it, computed by its
  // kernel on the way (no pass over memory; the float32 and bf16 kernels alike); none where the
  // gradient is not the accumulator's alone: a block the kernel has not written this step, the
  // product path, a .grad replaced or changed in place since. The caller must also know that
  // nothing wrote the gradient's memory without a version bump (a collective into a view does).
  std::optional<double> weight_grad_sqnorm() const;

  // Micro-batches whose backward ran but whose weight gradient is still pending.
  std::vector<int64_t> pending() const;
  // Drops everything kept (after a failed step).
  void clear();
  // Drops what is kept for micro-batches `mbs` whose backward has not run (a forward whose
  // graph was dropped without a backward); the others are left to backward_weight.
  void discard(const std::vector<int64_t>& mbs);

  // The weights were modified in place without a version bump (LibTorch's optimizers write
  // through .data()), so the cached W^T (oneDNN) and packed W (native) must be rebuilt. Call
  // after a step.
  void weights_changed();
  // Builds what backward needs from the current weights (the native kernel's packed W, or under
  // bf16 autocast the bf16 kernels' two copies) now, rather than in the step's first forward or
  // backward: the engine calls it while it waits.
  void prepare_backward();

  const torch::nn::Linear& layer() const { return layer_; }

 private:
  friend struct DeferredLinearFunction;
  const torch::Tensor& weight_transposed();  // W^T, contiguous, refreshed when W changes
  const PackedWeight& packed_weight();       // W for dx = dy W, refreshed when W changes
  // W in `dtype` (autocast's bf16/fp16 compute), refreshed when W changes.
  const torch::Tensor& weight_in(c10::ScalarType dtype);
  const PackedPairs& packed_lowp_weight();  // bf16 W for dx = dy W on the bf16 kernel, refreshed when W changes
  torch::Tensor low_precision_linear(const torch::Tensor& x2d);  // x2d in autocast's dtype
  bool native_eligible(const torch::Tensor& x) const;
  bool native_bf16_eligible(const torch::Tensor& x) const;  // bf16 x on the native bf16 kernels
  bool bf16_kernels_on() const;                             // this layer's bf16 inputs would take them
  size_t order_end_of(const std::vector<int64_t>& mbs) const;  // position after the last of mbs in order_
  // Backward kept dy of `mb`: it joins the native accumulator's order when the kernel takes it.
  void input_gradient_done(int64_t mb, const torch::Tensor& dy);
  void group_product(const std::vector<int64_t>& mbs);  // the one-product path
  void accumulate_block(size_t block, size_t upto);     // block takes in order_[done_[block]..upto)
  // The packed operands of order_[from..upto), packed on first use and kept in `operands`.
  template <typename Operands>
  std::vector<const Operands*> parts(std::map<int64_t, std::unique_ptr<Operands>>& operands, size_t from, size_t upto);
  void adopt_gradients();                               // the accumulators are the parameters' .grad
  void drop_completed();                                // forgets what every block has taken in
  void forget(int64_t mb);

  torch::nn::Linear layer_;
  GemmKernel kernel_;
  std::map<int64_t, torch::Tensor> inputs_;  // x of each micro-batch, 2-D
  std::map<int64_t, torch::Tensor> grads_;   // dy of each micro-batch, 2-D
  torch::Tensor weight_t_;
  int64_t weight_t_version_ = -1;
  const void* weight_t_data_ = nullptr;
  torch::Tensor weight_lowp_;
  int64_t weight_lowp_version_ = -1;
  const void* weight_lowp_data_ = nullptr;
  PackedWeight packed_;
  int64_t packed_version_ = -1;
  const void* packed_data_ = nullptr;
  PackedPairs packed_lowp_;
  int64_t packed_lowp_version_ = -1;
  const void* packed_lowp_data_ = nullptr;

  // The native accumulator.
  std::vector<int64_t> order_;                // micro-batches in the order their backward ran
  std::vector<size_t> done_;                  // per row block: how many of order_ it took in
  std::vector<bool> started_;                 // per row block: holds this step's sum (else fresh)
  std::map<int64_t, std::unique_ptr<WeightGradOperands>> operands_;  // packed once, when first used
  std::map<int64_t, std::unique_ptr<WeightGradPairs>> operands_bf16_;  // the same on the bf16 kernels
  std::set<int64_t> completed_;               // taken in by every block (so asking again is a no-op)
  std::vector<double> block_sq_;              // per row block: sum of squares the kernel left there
  std::vector<bool> block_sq_known_;          // per row block: block_sq_ holds this step's values
  int64_t sq_version_ = -1;                   // dw_'s version when the kernel took it over
  torch::Tensor dw_, db_;                     // handed to the parameters as their .grad
};

}  // namespace pipetrain::runtime
