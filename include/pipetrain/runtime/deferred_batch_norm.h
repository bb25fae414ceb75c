// Deferred batch norm: running statistics updated once per mini-batch, from all its
// micro-batches, while each micro-batch is normalised with its own statistics (torchgpipe's
// DeferredBatchNorm).
//
//   micro-batch forward (training, not recomputing):  sum += Σx, sum_squares += Σx², count += n
//   commit() after the mini-batch:  mean = sum / count, var = (sum_squares / count - mean²)
//                                   · count / (count - 1)          (unbiased, like BatchNorm)
//                                   running = (1 - m) · running + m · stat
//   m = momentum, or 1 / num_batches_tracked when momentum is unset (cumulative average).
//
// The running statistics therefore equal what one BatchNorm computes on the whole mini-batch.
// (torchgpipe folds in the biased variance; we use the unbiased one, as BatchNorm does.) The
// recomputation of a checkpointed micro-batch does not count it again.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace pipetrain::runtime {

class DeferredBatchNormImpl : public torch::nn::Cloneable<DeferredBatchNormImpl> {
 public:
  explicit DeferredBatchNormImpl(const torch::nn::BatchNormOptions& options);
  // Adopts existing tensors (those of a BatchNorm being converted) instead of making new ones.
  DeferredBatchNormImpl(const torch::nn::BatchNormOptions& options, torch::Tensor weight,
                        torch::Tensor bias, torch::Tensor running_mean, torch::Tensor running_var,
                        torch::Tensor num_batches_tracked);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  // Folds the micro-batches tracked since the last commit into the running statistics (nothing
  // when none were tracked), then forgets them.
  void commit();
  // Forgets the tracked micro-batches without updating (after a failed forward).
  void discard();
  int64_t tracked() const { return tracked_; }

  torch::nn::BatchNormOptions options;
  torch::Tensor weight, bias;                                   // affine parameters
  torch::Tensor running_mean, running_var, num_batches_tracked;  // buffers, as in BatchNorm

 private:
  void register_tensors();

  torch::Tensor sum_, sum_squares_;  // float64 accumulators over the tracked micro-batches
  int64_t count_ = 0;                // values per channel tracked
  int64_t tracked_ = 0;              // micro-batches tracked
};
TORCH_MODULE(DeferredBatchNorm);

// The model with each BatchNorm1d/2d/3d child that tracks running statistics replaced by a
// DeferredBatchNorm holding the same parameters and buffers (the tensors are shared, not
// copied). BatchNorm members of custom modules are not converted (their forward calls the
// member directly). (A LibTorch Sequential cannot hold another Sequential, so there is no
// nesting to follow.)
torch::nn::Sequential convert_deferred_batch_norm(const torch::nn::Sequential& model);

// Every DeferredBatchNorm in `module`'s tree.
std::vector<std::shared_ptr<DeferredBatchNormImpl>> deferred_batch_norms(torch::nn::Module& module);

}  // namespace pipetrain::runtime
