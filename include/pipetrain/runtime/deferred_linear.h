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
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <vector>

#include "pipetrain/runtime/gemm.h"
#include "pipetrain/runtime/small_gemm.h"

namespace pipetrain::runtime {

class DeferredLinear {
 public:
  DeferredLinear(torch::nn::Linear layer, GemmKernel kernel);

  // y = x W^T + b for x of shape (..., in). With grad mode on, keeps x under `mb` and returns
  // an output whose backward computes dx only and keeps dy under `mb`.
  torch::Tensor forward(const torch::Tensor& x, int64_t mb);

  // Adds the weight (and bias) gradients of micro-batches `mbs` to the parameters' .grad, in
  // one product; each of them must have run forward and backward. Forgets them afterwards.
  void backward_weight(const std::vector<int64_t>& mbs);

  // Micro-batches whose backward ran but whose weight gradient is still pending.
  std::vector<int64_t> pending() const;
  // Drops everything kept (after a failed step, or before recomputing a micro-batch).
  void forget(int64_t mb);
  void clear();

  // The weights were modified in place without a version bump (LibTorch's optimizers write
  // through .data()), so the cached W^T (oneDNN) and packed W (native) must be rebuilt. Call
  // after a step.
  void weights_changed();
  // Builds what backward needs from the current weights (the native kernel's packed W) now,
  // rather than in the first backward of the step: the engine calls it while it waits.
  void prepare_backward();

  const torch::nn::Linear& layer() const { return layer_; }

 private:
  friend struct DeferredLinearFunction;
  const torch::Tensor& weight_transposed();  // W^T, contiguous, refreshed when W changes
  const PackedWeight& packed_weight();       // W for dx = dy W, refreshed when W changes
  bool native_eligible(const torch::Tensor& x) const;

  torch::nn::Linear layer_;
  GemmKernel kernel_;
  std::map<int64_t, torch::Tensor> inputs_;  // x of each micro-batch, 2-D
  std::map<int64_t, torch::Tensor> grads_;   // dy of each micro-batch, 2-D
  torch::Tensor weight_t_;
  int64_t weight_t_version_ = -1;
  const void* weight_t_data_ = nullptr;
  PackedWeight packed_;
  PackedWeight packed_inputs_;  // the fused x of backward_weight, buffer kept across steps
  int64_t packed_version_ = -1;
  const void* packed_data_ = nullptr;
};

}  // namespace pipetrain::runtime
