// GPipe: a torch::nn::Sequential trained as a pipeline over devices, in one process
// (torchgpipe's GPipe in C++).
//
//   auto model = torch::nn::Sequential(...);                 // 8 layers
//   pipetrain::GPipe gpipe(model, pipetrain::GPipeOptions({4, 4}).chunks(8));
//   auto out = gpipe->forward(x);                            // micro-batches, pipelined
//   torch::mse_loss(out, y).backward();                      // gradients for every layer
//
// The model is split into partitions by `balance` (layers per partition), each placed on its
// device and run by its own worker thread; a mini-batch is cut into `chunks` micro-batches that
// flow through the partitions on the fill-drain clock (runtime/pipeline.h). Activation
// checkpointing keeps only each partition's input for the micro-batches below the checkpoint
// stop and recomputes the rest in backward (runtime/checkpoint.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/runtime/checkpoint.h"
#include "pipetrain/runtime/deferred_batch_norm.h"
#include "pipetrain/runtime/pipeline.h"
#include "pipetrain/runtime/worker.h"
#include "pipetrain/schedule/timeline.h"

namespace pipetrain {

// Which micro-batches are checkpointed in training (in eval mode none are).
enum class Checkpoint {
  Always,      // every micro-batch
  ExceptLast,  // all but the last (its backward starts at once, so recomputing it gains nothing)
  Never,
};

std::string to_string(Checkpoint mode);

struct GPipeOptions {
  /*implicit*/ GPipeOptions(std::vector<int64_t> balance);  // NOLINT

  // Layers per partition, in order; must sum to the number of layers. See
  // partition/balance.h (balance_by_time, balance_by_size, balance_by_params) to compute one.
  TORCH_ARG(std::vector<int64_t>, balance);
  // Micro-batches per mini-batch (torch::chunk semantics: fewer when there are fewer rows).
  TORCH_ARG(int64_t, chunks) = 1;
  TORCH_ARG(Checkpoint, checkpoint) = Checkpoint::ExceptLast;
  // One device per partition (extra devices are dropped). Empty: every CUDA device, or the
  // CPU for every partition when there is no CUDA device.
  TORCH_ARG(std::vector<torch::Device>, devices) = {};
  // Replace BatchNorm layers by runtime::DeferredBatchNorm: running statistics once per
  // mini-batch, equal to a BatchNorm's on the whole mini-batch.
  TORCH_ARG(bool, deferred_batch_norm) = false;
  // Replace torch::nn::Dropout layers by runtime::Dropout, which draws from the task's own
  // generator: masks do not depend on thread timing and recomputation repeats them exactly.
  TORCH_ARG(bool, convert_dropout) = true;
  // OpenMP threads for each worker (ATen kernels, an OpenMP BLAS); 0 leaves the default.
  TORCH_ARG(int64_t, intra_op_threads) = 0;
  // torch::nn::Linear layers take the engine's fast path (runtime/deferred_linear.h): backward
  // computes their input gradients per micro-batch and their weight gradients once per step,
  // one product over every micro-batch. A backward that keeps the graph (retain_graph) needs
  // it off.
  TORCH_ARG(bool, deferred_linear) = true;
  // The fast path's GEMM: "auto" (pipetrain's native kernel on AVX2/AVX-512 CPUs), "native",
  // "onednn" or "blas" (runtime/gemm.h).
  TORCH_ARG(std::string, gemm_kernel) = "auto";
  // Seconds one clock tick's tasks (a micro-batch through a partition) may take before forward
  // throws a TimeoutError naming the partition and micro-batch instead of waiting for ever.
  // The hung task's thread is left to finish alone; the next forward starts new workers.
  TORCH_ARG(double, task_timeout) = 600.0;
};

class GPipeImpl : public torch::nn::Module {
 public:
  GPipeImpl(const torch::nn::Sequential& module, const GPipeOptions& options);
  ~GPipeImpl() override;

  // The model on a mini-batch: scatter into micro-batches, pipeline, gather. An empty model
  // returns its input.
  torch::Tensor forward(const torch::Tensor& input);
  // For models whose layers pass several tensors; non-floating ones (masks, ids) pass through
  // without gradients.
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& input);
  Batch forward_batch(const Batch& input);

  // The layers of the wrapped model: count, index (negative counts from the end), iteration.
  int64_t size() const { return static_cast<int64_t>(layers_.size()); }
  std::shared_ptr<torch::nn::Module> operator[](int64_t index) const;
  std::vector<std::shared_ptr<torch::nn::Module>>::const_iterator begin() const {
    return layers_.begin();
  }
  std::vector<std::shared_ptr<torch::nn::Module>>::const_iterator end() const {
    return layers_.end();
  }

  // One device per partition; the last is the output device (move targets there).
  const std::vector<torch::Device>& devices() const { return devices_; }
  const std::vector<int64_t>& balance() const { return options_.balance(); }
  int64_t chunks() const { return options_.chunks(); }
  Checkpoint checkpoint() const { return options_.checkpoint(); }
  const GPipeOptions& options() const { return options_; }
  int64_t num_partitions() const { return static_cast<int64_t>(stages_.size()); }
  const torch::nn::Sequential& partition(int64_t j) const { return stages_.at(j).layers; }

  // The last step's tasks (its forward, and its backward where one ran): one row per partition,
  // seconds from the step's start, ops forward / backward (one micro-batch through one
  // partition) and backward_weight (a partition's fast-path weight gradients, micro-batch -1).
  // The caller's time between forward() and backward() is taken out. Render them with
  // schedule::render_chrome_trace (chrome_trace() below) or schedule::bubble_stats.
  std::vector<schedule::TimedEvent> last_step_events() const;
  // The last step as a Chrome / Perfetto trace (JSON), rows "partition j".
  std::string chrome_trace() const;
  // The last step's bubble: measured (idle fraction of the partitions' rows over the step) and
  // simulated (the fill-drain schedule of the same partitions and micro-batches run by the
  // simulator with the costs the step measured, schedule/simulate.h).
  struct Bubble {
    double measured = 0;
    double simulated = 0;
  };
  Bubble last_step_bubble() const;

  // GPipe manages placement: moving it to a device throws DeviceError; a dtype cast is fine.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  void pretty_print(std::ostream& stream) const override;

 private:
  // Whether a forward now builds a graph: an input or a parameter requires grad.
  bool needs_backward(const Batch& input) const;

  GPipeOptions options_;
  std::vector<runtime::Stage> stages_;
  std::vector<std::shared_ptr<torch::nn::Module>> layers_;
  std::vector<torch::Device> devices_;
  std::vector<std::shared_ptr<runtime::DeferredBatchNormImpl>> deferred_;
  // Started at the first forward; shared with the backward of each step (runtime/pipeline_backward.h).
  std::shared_ptr<runtime::WorkerPool> workers_;
  int64_t next_mb_ = 0;  // the next step's first micro-batch key (runtime::run_pipeline)
  std::shared_ptr<runtime::StepTimeline> last_timeline_;  // the last step's (filled by its workers)
  // The partition that stashes each skip (for the backward's routing).
  std::vector<std::pair<skip::SkipKey, int64_t>> stash_partitions_;
  std::mutex forward_mutex_;                      // one forward at a time
};
TORCH_MODULE(GPipe);

// The checks GPipe runs on its model (ModuleError): no child twice, no parameter shared by two
// distinct children.
void verify_module(const torch::nn::Sequential& module);

// Splits `module` into partitions by `balance` on `devices` (BalanceError, DeviceError);
// devices beyond the partitions are dropped from `devices`.
std::vector<runtime::Stage> split_module(const torch::nn::Sequential& module,
                                         const std::vector<int64_t>& balance,
                                         std::vector<torch::Device>& devices);

}  // namespace pipetrain
