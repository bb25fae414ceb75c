// The single-process pipeline: micro-batches through partitions on the fill-drain clock, one
// worker thread per partition.
//
// Forward, tick by tick (runtime/clock.h). For every task (i, j) of a tick the caller thread
// moves micro-batch i to partition j's device (runtime/device.h) and queues the task on worker
// j; then it waits for all of the tick's tasks. A task runs partition j's layers on micro-batch
// i, with checkpointing when i < checkpoint_stop:
//
//        caller thread          worker 0               worker 1
//   k=0  queue (0,0), wait ──►  F(0,0)
//   k=1  queue (1,0),(0,1) ──►  F(1,0)        ║        F(0,1)        (concurrent)
//   k=2  queue (1,1), wait ─────────────────────────►  F(1,1)
//
// Each task runs with the caller's thread-local state (grad mode, autocast, profiler ...) and
// its own task generator seeded from (seed, i, j) (runtime/rng.h), so random layers draw the
// same numbers whatever the threads' timing, and a checkpoint's recomputation repeats them.
//
// In training each task's graph is its own, and the backward runs as a pipeline on the same
// workers when autograd reaches the gathered output (runtime/pipeline_backward.h).
//
// Failure: when a task throws, the tick's other tasks are still awaited, no further tick
// starts (upstream partitions stop early), and the first exception is rethrown unchanged.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <functional>
#include <mutex>
#include <memory>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/runtime/clock.h"
#include "pipetrain/runtime/deferred_linear.h"
#include "pipetrain/runtime/rng.h"
#include "pipetrain/runtime/worker.h"
#include "pipetrain/schedule/timeline.h"
#include "pipetrain/skip/plan.h"

namespace pipetrain::runtime {

// One partition: its layers, its device, and the model index of its first layer (for errors).
struct Stage {
  torch::nn::Sequential layers;
  torch::Device device = torch::kCPU;
  int64_t index = 0;        // j
  int64_t first_layer = 0;  // index of layers[0] in the whole model
  // The whole model's skips (shared by its stages); null or empty without skips.
  std::shared_ptr<const skip::SkipPlan> skips;
  std::shared_ptr<DrawHistory> draws = std::make_shared<DrawHistory>();  // runtime/rng.h
  // By layer: the engine's Linear fast path (runtime/deferred_linear.h), null where a layer
  // does not take it. Used on the stage's worker only.
  std::vector<std::shared_ptr<DeferredLinear>> fast;
};

// Runs the layers of `stage` on `input` in order; `mb` keys what a fast-path Linear keeps for
// its weight gradient (unique per micro-batch among the steps whose backward is pending).
Batch forward_stage(const Stage& stage, const Batch& input, int64_t mb);

class StepGraph;  // runtime/pipeline_backward.h

// When each task of one step ran: rows are partitions, times seconds from the step's start
// (schedule/timeline.h), filled by the workers. The backward's events are moved back by the
// caller's time between the end of forward() and the start of the backward, so the step reads
// as the pipeline ran it.
class StepTimeline {
 public:
  StepTimeline() : start_(std::chrono::steady_clock::now()) {}
  void record(int64_t partition, schedule::Op op, int64_t micro_batch, std::chrono::steady_clock::time_point from,
              std::chrono::steady_clock::time_point to);
  // The backward starts now: later events are moved back to follow the forward's last one.
  void backward_starts();
  std::vector<schedule::TimedEvent> events() const;

 private:
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point start_;
  double shift_ = 0;  // seconds taken off later events
  std::vector<schedule::TimedEvent> events_;
};

// Runs every micro-batch through every stage, in place: batches[i] becomes the last stage's
// output for micro-batch i. `workers` has one worker per stage.
//
// With `graph` (training), each task's graph is its own and its ends are recorded there, for
// the pipelined backward (runtime/pipeline_backward.h); without, the outputs carry one graph
// through every partition back to the inputs (or none, under no_grad).
//
// Skips: micro-batch i's stashed tensors wait in its own tracker between the stage that
// stashes them and the stage that pops them, which moves them to its device (directly, not
// through the stages in between); see runtime/skip_range.h for checkpointed stages.
// Each task must finish within `task_timeout_s` of its tick's start: a later one is a
// TimeoutError naming partition and micro-batch, the pool is abandoned (WorkerPool::abandon;
// the caller must not reuse it) and the late task, which owns what it uses, runs on alone.
// Micro-batch i is keyed `first_mb + i` for the fast-path Linear layers (forward_stage).
// With `timeline`, each task's run is recorded there.
void run_pipeline(const std::vector<Stage>& stages, std::vector<Batch>& batches, int64_t checkpoint_stop,
                  uint64_t seed, WorkerPool& workers, double task_timeout_s, StepGraph* graph = nullptr,
                  int64_t first_mb = 0, std::shared_ptr<StepTimeline> timeline = nullptr);

// The clock both halves of a step run on: the tasks of each tick are made on the calling
// thread (`make(i, j)`), queued on worker j and all awaited, each until the tick's deadline,
// even after one has failed; `sink` takes each result on the calling thread. Then the next
// tick, or the first failure rethrown; a task past its deadline is a TimeoutError naming the
// `phase` ("forward", "backward"), the partition and the micro-batch, and abandons the pool.
using TaskMaker = std::function<std::function<Batch()>(int64_t i, int64_t j)>;
using ResultSink = std::function<void(int64_t i, int64_t j, Batch result)>;
// With `timeline`, each task's run is recorded there as `op`.
void run_ticks(const std::vector<Tick>& ticks, WorkerPool& workers, double task_timeout_s, const char* phase,
               const TaskMaker& make, const ResultSink& sink, const std::shared_ptr<StepTimeline>& timeline = nullptr,
               schedule::Op op = schedule::Op::forward);

}  // namespace pipetrain::runtime
