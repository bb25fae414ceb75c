// The single-process pipeline (see the picture in pipeline.h).
#include "pipetrain/runtime/pipeline.h"

#include <ATen/ThreadLocalState.h>

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <optional>

#include "pipetrain/error.h"
#include "pipetrain/runtime/autocast.h"
#include "pipetrain/runtime/clock.h"
#include "pipetrain/runtime/device.h"
#include "pipetrain/runtime/pipeline_backward.h"
#include "pipetrain/runtime/rng.h"
#include "pipetrain/runtime/skip_range.h"
#include "pipetrain/runtime/stream.h"
#include "pipetrain/runtime/stream_copy.h"

namespace pipetrain::runtime {
namespace {

// Micro-batch i through stage j, checkpointed or not; runs on worker j.
// `arrived_on`: the copy stream the input came on from another device, if it did.
Batch run_task(const Stage& stage, const Batch& arrived, const std::optional<c10::Stream>& arrived_on, int64_t i,
               bool checkpoint, uint64_t seed, const at::ThreadLocalState& caller_state,
               const AutocastState& caller_autocast, skip::SkipTracker& tracker, TaskEnds* ends, int64_t first_mb) {
  at::ThreadLocalStateGuard state(caller_state);
  // The caller's mixed precision (its autocast dtype is not part of ThreadLocalState in 1.13).
  // A worker never leaves autocast's outermost scope, so it would never clear cached casts of
  // weights the optimizer has since changed: no cache here.
  AutocastStateScope autocast(caller_autocast);
  NoCastCacheScope no_cache;
  DeviceScope device(stage.device);
  // The partition's compute stream waits for the copy that brought its input.
  const Batch input = arrived_on ? wait_for_copy(arrived, *arrived_on, current_stream(stage.device)) : arrived;
  TaskGeneratorScope rng(make_generator(task_seed(seed, i, stage.index)));
  // Ops that draw from the default generator (torch::dropout, a Dropout inside a custom module,
  // torch::rand) get a stream of their own per task, apart from runtime::Dropout's, under a
  // lease: the same masks whatever the timing, and checkpoints recompute them exactly.
  LearnedLease lease(*stage.draws, stage.layers->is_training(), make_generator(task_seed(~seed, i, stage.index)));
  static const skip::SkipPlan no_skips;
  const skip::SkipPlan& plan = stage.skips ? *stage.skips : no_skips;
  const int64_t first = stage.first_layer;
  const int64_t last = first + static_cast<int64_t>(stage.layers->size());
  // Skipped tensors travel straight from the stashing stage's device to this one; an undefined
  // one (an optional skip) has no device and arrives as it is.
  for (const auto& r : plan.pops_in(first, last)) {
    torch::Tensor t = tracker.pop(r.key);
    if (t.defined() && t.device() != stage.device) t = t.to(stage.device);
    if (ends) {  // the stashing partition's graph ends here: its gradient goes back by the plan
      SkipEnd end;
      end.key = r.key;
      t = enter_partition(t, end.slot);
      ends->popped.push_back(std::move(end));
    }
    tracker.stash(r.key, t);
  }
  // The closure outlives this call when checkpointed: backward runs it again to recompute.
  auto run = [stage, mb = first_mb + i](const Batch& x) {
    DeviceScope device(stage.device);
    return forward_stage(stage, x, mb);
  };
  Batch output = run_with_skips(plan, first, last, input, tracker, checkpoint, run);
  if (ends) {
    for (const auto& r : plan.stashes_out(first, last)) {
      torch::Tensor t = tracker.pop(r.key);
      tracker.stash(r.key, t);
      SkipEnd end;
      end.key = r.key;
      end.stashed = GraphEnd::of(t);
      ends->stashed.push_back(std::move(end));
    }
    for (const auto& t : output.tensors()) ends->outputs.push_back(GraphEnd::of(t));
  }
  return output;
}

}  // namespace

Batch forward_stage(const Stage& stage, const Batch& input, int64_t mb) {
  Batch batch = input;
  int64_t index = stage.first_layer;
  size_t k = 0;
  torch::nn::Sequential layers = stage.layers;  // a handle: the layers are shared, not copied
  for (auto& layer : *layers) {
    const auto& fast = k < stage.fast.size() ? stage.fast[k] : nullptr;
    batch = fast && batch.atomic() ? Batch(fast->forward(batch.tensor(), mb)) : call_layer(layer, batch, index);
    ++index;
    ++k;
  }
  return batch;
}

void StepTimeline::record(int64_t partition, schedule::Op op, int64_t micro_batch,
                          std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  std::lock_guard<std::mutex> lock(mutex_);
  schedule::TimedEvent e;
  e.stage = static_cast<int>(partition);
  e.op = op;
  e.micro_batch = static_cast<int>(micro_batch);
  e.start = std::chrono::duration<double>(from - start_).count() - shift_;
  e.end = std::chrono::duration<double>(to - start_).count() - shift_;
  events_.push_back(e);
}

void StepTimeline::backward_starts() {
  std::lock_guard<std::mutex> lock(mutex_);
  double last = 0;
  for (const auto& e : events_) last = std::max(last, e.end);
  shift_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() - last;
}

std::vector<schedule::TimedEvent> StepTimeline::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

void run_ticks(const std::vector<Tick>& ticks, WorkerPool& workers, double task_timeout_s, const char* phase,
               const TaskMaker& make, const ResultSink& sink, const std::shared_ptr<StepTimeline>& timeline,
               schedule::Op op) {
  const auto budget = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(task_timeout_s));
  for (const Tick& tick : ticks) {
    std::vector<TaskResult<Batch>> results;
    results.reserve(tick.size());
    for (const auto& [i, j] : tick) {
      std::function<Batch()> task = make(i, j);
      if (timeline) {
        task = [task = std::move(task), timeline, op, i = i, j = j] {
          const auto from = std::chrono::steady_clock::now();
          Batch out = task();
          timeline->record(j, op, i, from, std::chrono::steady_clock::now());
          return out;
        };
      }
      results.push_back(workers.submit<Batch>(j, std::move(task)));
    }
    // Wait for every task of the tick, even after a failure (none may run on into the next
    // tick), each until the tick's deadline.
    const auto deadline = std::chrono::steady_clock::now() + budget;
    std::exception_ptr failure;
    for (size_t t = 0; t < tick.size(); ++t) {
      if (!results[t].wait_until(deadline)) {
        workers.abandon();
        throw TimeoutError(fmt::format(
            "GPipe: partition {} did not finish the {} of micro-batch {} within {} s (GPipeOptions::task_timeout); "
            "a layer of that partition hangs or needs longer: fix the layer or raise task_timeout",
            tick[t].second, phase, tick[t].first, task_timeout_s));
      }
      try {
        sink(tick[t].first, tick[t].second, results[t].get());
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
}

void run_pipeline(const std::vector<Stage>& stages, std::vector<Batch>& batches, int64_t checkpoint_stop,
                  uint64_t seed, WorkerPool& workers, double task_timeout_s, StepGraph* graph, int64_t first_mb,
                  std::shared_ptr<StepTimeline> timeline) {
  TORCH_INTERNAL_ASSERT(workers.size() == static_cast<int64_t>(stages.size()),
                        "one worker per stage");
  const auto m = static_cast<int64_t>(batches.size());
  // Owned jointly with the tasks: a task still running after its wait timed out must find
  // them alive when this frame is gone.
  auto caller_state = std::make_shared<const at::ThreadLocalState>();
  auto caller_autocast = std::make_shared<const AutocastState>(AutocastState::current());
  auto trackers = std::make_shared<std::vector<skip::SkipTracker>>(static_cast<size_t>(m));
  // torchgpipe's copy streams: one per partition, where activations arrive from the previous
  // partition's device (on the CPU the one no-op stream).
  std::vector<c10::Stream> copy_streams;
  for (const auto& stage : stages) copy_streams.push_back(new_copy_stream(stage.device));
  auto make = [&](int64_t i, int64_t j) -> std::function<Batch()> {
    const Stage& stage = stages[j];
    const bool crossing = j > 0 && stages[j - 1].device != stage.device;
    Batch input = crossing ? copy_on_stream(batches[i], current_stream(stages[j - 1].device), copy_streams[j])
                           : copy_to(batches[i], stage.device);
    TaskEnds* ends = nullptr;
    if (graph) {
      ends = &graph->at(i, j);
      input = enter_partition(input, ends->inputs);
    }
    const bool checkpoint = i < checkpoint_stop;
    std::optional<c10::Stream> arrived_on;
    if (crossing) arrived_on = copy_streams[j];
    return [stage, caller_state, caller_autocast, trackers, input, i, checkpoint, seed, arrived_on, ends, first_mb] {
      return run_task(stage, input, arrived_on, i, checkpoint, seed, *caller_state, *caller_autocast,
                      (*trackers)[static_cast<size_t>(i)], ends, first_mb);
    };
  };
  run_ticks(clock_cycles(m, static_cast<int64_t>(stages.size())), workers, task_timeout_s, "forward", make,
            [&](int64_t i, int64_t, Batch output) { batches[i] = std::move(output); }, timeline,
            schedule::Op::forward);
}

}  // namespace pipetrain::runtime
