// The stage executor: runs one stage's action list of a schedule for one step.
//
// It knows nothing about schedule kinds: it interprets the actions (schedule/action.h gives
// their semantics) over the stage's model chunks and a Channel. At the start of a step it
// posts every receive of the step (in list order, which is each stream's send order), so
// transfers land while the stage computes; sends never block; every wait has the channel's
// timeout. The step actions (reduce tied grads, reduce grads, optimizer step) are handed back
// to the engine through a callback.
//
// Skip links are traffic outside the action list: a chunk receives the tensors it pops right
// before its forward and sends the ones it stashes right after; gradients go back the same way
// around backward. Their receives are posted at the start of the step too, in the sending
// stage's order.
#pragma once

#include <torch/torch.h>

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/batch/data_iterator.h"
#include "pipetrain/comm/channel.h"
#include "pipetrain/runtime/tensor_parallel.h"
#include "pipetrain/runtime/skip_links.h"
#include "pipetrain/runtime/stage_model.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/timeline.h"

namespace pipetrain::runtime {

// The loss of one micro-batch (a scalar) from the last chunk's output and the labels.
using LossFunction = std::function<torch::Tensor(const Batch& outputs, const Batch& labels)>;

struct StageStepResult;

struct StageStep {
  const schedule::Schedule* schedule = nullptr;
  int stage = 0;
  std::vector<StageModel*> chunks;             // by local chunk index
  comm::Channel* channel = nullptr;
  std::function<int(int stage)> rank_of_stage;  // a stage of this replica -> its global rank
  LossFunction loss;                            // needed where the last chunk lives
  // The step's micro-batches, where this stage loads inputs or labels (empty elsewhere),
  // copied to `device` (the stage's) as they are loaded.
  const std::vector<MicroBatch>* data = nullptr;
  torch::Device device = torch::kCPU;
  // Under tensor parallelism: activations and gradients cross stages in 1/T parts
  // (runtime/partitioned_transfer.h), assembled by the receiving group.
  TensorParallelGroup tensor_parallel;
  // fp16 loss scaling: backward starts from loss x loss_scale (the reported loss is unscaled).
  double loss_scale = 1.0;
  bool training = true;
  bool keep_outputs = false;  // eval: return the last chunk's outputs
  // Runs reduce_tied_grads, reduce_grads and optimizer_step; gets the step's result so far
  // (the loss, for the optimizer step's checks).
  std::function<void(schedule::Op, const StageStepResult& so_far)> on_step_op;
  // Seconds on a steady clock (one per host; the engine aligns hosts' clocks), for the trace.
  std::function<double()> clock;
  // Lent as the default CPU generator during each forward (runtime/rng.h): the stage's random
  // ops draw from it whatever other threads of the process do. Undefined: the default
  // generator is lent as it is.
  at::Generator rng_stream;
  // The model's skip links (runtime/skip_links.h); null or empty without skips between parts.
  const std::vector<SkipLink>* skip_links = nullptr;
};

struct StageStepResult {
  double loss_sum = 0;  // sum of per-micro-batch losses (unscaled), where the last chunk lives
  int64_t losses = 0;   // how many
  std::vector<Batch> outputs;                 // by micro-batch, with keep_outputs
  std::vector<schedule::TimedEvent> events;   // one per action, row = stage
  std::array<double, schedule::kNumOps> seconds{};  // time per op kind
  int64_t weight_pauses = 0;  // weight-gradient groups paused for an arrived gradient
  int64_t bytes_sent = 0;     // tensor bytes this stage sent to other stages (not hand-overs)
};

// Runs the actions of `step.stage`. Throws what a layer, the loss or the channel throws, with
// the action that failed in the message; kept tensors are dropped first.
StageStepResult run_stage_step(const StageStep& step);

}  // namespace pipetrain::runtime
