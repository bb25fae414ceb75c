// The single-process pipeline (see the picture in pipeline.h).
#include "pipetrain/runtime/pipeline.h"

#include <ATen/ThreadLocalState.h>

#include <exception>
#include <future>

#include "pipetrain/error.h"
#include "pipetrain/runtime/clock.h"
#include "pipetrain/runtime/dependency.h"
#include "pipetrain/runtime/device.h"
#include "pipetrain/runtime/rng.h"
#include "pipetrain/runtime/skip_range.h"

namespace pipetrain::runtime {
namespace {

// Micro-batch i through stage j, checkpointed or not; runs on worker j.
Batch run_task(const Stage& stage, const Batch& input, int64_t i, bool checkpoint, uint64_t seed,
               const at::ThreadLocalState& caller_state, skip::SkipTracker& tracker) {
  at::ThreadLocalStateGuard state(caller_state);
  DeviceScope device(stage.device);
  TaskGeneratorScope rng(make_generator(task_seed(seed, i, stage.index)));
  static const skip::SkipPlan no_skips;
  const skip::SkipPlan& plan = stage.skips ? *stage.skips : no_skips;
  const int64_t first = stage.first_layer;
  const int64_t last = first + static_cast<int64_t>(stage.layers->size());
  // Skipped tensors travel straight from the stashing stage's device to this one; an undefined
  // one (an optional skip) has no device and arrives as it is.
  for (const auto& r : plan.pops_in(first, last)) {
    torch::Tensor t = tracker.pop(r.key);
    tracker.stash(r.key, !t.defined() || t.device() == stage.device ? t : t.to(stage.device));
  }
  // The closure outlives this call when checkpointed: backward runs it again to recompute.
  auto run = [stage](const Batch& x) {
    DeviceScope device(stage.device);
    return forward_stage(stage, x);
  };
  return run_with_skips(plan, first, last, input, tracker, checkpoint, run);
}

}  // namespace

Batch forward_stage(const Stage& stage, const Batch& input) {
  Batch batch = input;
  int64_t index = stage.first_layer;
  torch::nn::Sequential layers = stage.layers;  // a handle: the layers are shared, not copied
  for (auto& layer : *layers) batch = call_layer(layer, batch, index++);
  return batch;
}

void run_pipeline(const std::vector<Stage>& stages, std::vector<Batch>& batches,
                  int64_t checkpoint_stop, uint64_t seed, WorkerPool& workers) {
  TORCH_INTERNAL_ASSERT(workers.size() == static_cast<int64_t>(stages.size()),
                        "one worker per stage");
  const auto m = static_cast<int64_t>(batches.size());
  const auto n = static_cast<int64_t>(stages.size());
  const at::ThreadLocalState caller_state;
  std::vector<skip::SkipTracker> trackers(static_cast<size_t>(m));
  for (const Tick& tick : clock_cycles(m, n)) {
    std::vector<std::future<Batch>> results;
    results.reserve(tick.size());
    for (const auto& [i, j] : tick) {
      const Stage& stage = stages[j];
      // Backward of (i, j) before (i - 1, j); only where devices run backward concurrently.
      if (i > 0 && !stage.device.is_cpu()) depend(batches[i - 1], batches[i]);
      Batch input = copy_to(batches[i], stage.device);
      const bool checkpoint = i < checkpoint_stop;
      auto& tracker = trackers[static_cast<size_t>(i)];
      results.push_back(workers.submit<Batch>(j, [&stage, &caller_state, &tracker, input, i,
                                                  checkpoint, seed] {
        return run_task(stage, input, i, checkpoint, seed, caller_state, tracker);
      }));
    }
    // Wait for every task of the tick, even after a failure: none may outlive this frame.
    std::exception_ptr failure;
    for (size_t t = 0; t < tick.size(); ++t) {
      try {
        batches[tick[t].first] = results[t].get();
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace pipetrain::runtime
