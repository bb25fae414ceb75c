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
// The outputs are ordinary autograd tensors: the graph runs from the last partition's outputs
// through every partition back to the inputs, so backward on the gathered output is one
// ordinary autograd pass (on the thread that calls it).
//
// Failure: when a task throws, the tick's other tasks are still awaited, no further tick
// starts (upstream partitions stop early), and the first exception is rethrown unchanged.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/runtime/rng.h"
#include "pipetrain/runtime/worker.h"
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
};

// Runs the layers of `stage` on `input` in order.
Batch forward_stage(const Stage& stage, const Batch& input);

// Runs every micro-batch through every stage, in place: batches[i] becomes the last stage's
// output for micro-batch i. `workers` has one worker per stage.
//
// Skips: micro-batch i's stashed tensors wait in its own tracker between the stage that
// stashes them and the stage that pops them, which moves them to its device (directly, not
// through the stages in between); see runtime/skip_range.h for checkpointed stages.
// Each task must finish within `task_timeout_s` of its tick's start: a later one is a
// TimeoutError naming partition and micro-batch, the pool is abandoned (WorkerPool::abandon;
// the caller must not reuse it) and the late task, which owns what it uses, runs on alone.
void run_pipeline(const std::vector<Stage>& stages, std::vector<Batch>& batches,
                  int64_t checkpoint_stop, uint64_t seed, WorkerPool& workers, double task_timeout_s);

}  // namespace pipetrain::runtime
