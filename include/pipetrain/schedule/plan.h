// The planner's search: every layout of a model over N processes (stages x replicas, micro-
// batches, schedule kind, balance, activation checkpointing) costed with the simulator and the
// memory model, best first. Pure: per-layer costs in (profiled by runtime/layer_profile.h),
// plans out.
//
// Predicted step time of a candidate (all times per micro-batch from the profile at its size):
//
//   stage costs   F, B, W = sums over the stage's layers (all its chunks); checkpointing adds a
//                 recompute forward to B
//   transfer      link.latency_s + boundary bytes / link.bytes_per_s, per sending stage;
//                 posting a send keeps the sender link.send_s
//   pipeline      simulate() of the schedule as the engine runs it (weight gradients deferred,
//                 waits filled when the engine accumulates natively): stage j ends at end_j
//   optimizer     per stage, the profiled ends of step of its layers (each layer's gradient
//                 norm and optimizer step, timed with its tensors out of the cache as after a
//                 stage's weight-gradient pass), but no less than the bytes the step streams
//                 over stream_bytes_per_s:
//                 gradients read for the norm and again by the update, parameters read and
//                 written, optimizer state read and written ((4 + 2 * optimizer_state_factor)
//                 x parameter bytes); a stage's parameters rarely fit in cache beside its
//                 gradients
//   step          max_j (end_j + optimizer_j + allreduce_j) + step_overhead_s, where a data-
//                 parallel all-reduce of stage j's gradients costs
//                 link.latency_s + 2 (R-1)/R * grad bytes / link.allreduce_bytes_per_s
//   oversubscribed  with more processes than cores, the pipeline is simulated with the ranks
//                 sharing the cores (CostModel::cores = cores / R: at every moment the ranks
//                 that have work share them equally, at shared_efficiency of their speed while
//                 they outnumber the cores, and each message costs its ranks shared_message_s);
//                 the updates start together after the last end and share the cores too:
//                 step = max_j end_j + max(max_j (optimizer_j + allreduce_j),
//                                          R sum_j optimizer_j / (cores shared_efficiency)),
//                 and never less than all ranks' work over the cores
//
// samples/s = replicas * batch rows / step.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "pipetrain/schedule/memory.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// Per-layer costs at one micro-batch size (seconds and bytes).
struct LayerCosts {
  std::vector<double> forward, backward_input, backward_weight, optimizer;
  std::vector<double> activation_bytes, output_bytes, param_bytes;
  // Kept between steps besides the parameters (gradients, optimizer state, cached copies), as
  // profiled; empty: param_bytes x (1 + optimizer_state_factor).
  std::vector<double> state_bytes;
  // Of activation_bytes, what the Linear fast path keeps until the weight gradient (its input);
  // empty: none.
  std::vector<double> weight_bytes;
  double input_bytes = 0;  // the model's input per micro-batch
};

struct LinkModel {
  double latency_s = 0;            // per message
  double bytes_per_s = 1e9;        // bandwidth between two local ranks
  double send_s = 0;               // time a send keeps its sender
  double allreduce_bytes_per_s = 1e9;  // a data-parallel gradient all-reduce's bus bandwidth
};

struct PlanSearchOptions {
  int processes = 2;                  // stages x replicas = processes
  int cores = 2;                      // CPU cores the processes share
  int batch_rows = 256;               // rows per step and replica
  std::map<int, LayerCosts> costs;    // by micro-batch count M (micro-batch = batch_rows / M)
  std::vector<ScheduleKind> kinds;    // empty: every training kind (training_kinds())
  std::vector<int> stage_counts;      // empty: every divisor of processes
  std::vector<int> interleaved_chunks{2};
  bool try_checkpoint = true;         // also each plan with whole-part checkpointing
  double max_memory_bytes = 0;        // per process; 0: no cap
  double optimizer_state_factor = 0;  // optimizer bytes per parameter byte (memory.h)
  LinkModel link;
  double step_overhead_s = 0;         // per step, outside the pipeline (loss all-reduce, barrier)
  // Bytes per second an optimizer step streams through memory with the other ranks at work
  // (read a, read b, write a counts 3 bytes per element byte); 0: the profiled steps alone.
  double stream_bytes_per_s = 0;
  bool fill_waits = false;            // the engine accumulates weight gradients natively
  // More processes than cores: the share of a core's time that does a rank's work while the
  // ranks that can run outnumber the cores (CostModel::shared_efficiency).
  double shared_efficiency = 1;
  double shared_message_s = 0;  // more processes than cores: CostModel::message_work
  bool defer_weights = true;          // the engine's Linear fast path (defer_weight_gradients)
  // Data-parallel replicas all-reduce gradients in buckets of this size; the memory model
  // counts three of them (the flattened bucket and the collective's buffers, as measured).
  double allreduce_bucket_bytes = 25 << 20;
};

struct Plan {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int stages = 1;
  int replicas = 1;
  int micro_batches = 1;
  int chunks = 1;
  std::vector<int64_t> balance;  // layers per model part (stages x chunks, virtual-stage order)
  int64_t checkpoint = 0;        // activation_checkpoint_interval (0: off)
  double step_s = 0;
  double samples_per_s = 0;
  double bubble = 0;
  std::vector<double> peak_memory_bytes;  // per stage
  double max_peak_memory_bytes() const;
};

// Predicts one layout (the costs at its micro-batch count must be in options.costs).
// ScheduleError / ConfigError when the layout cannot be generated.
Plan evaluate_plan(const PlanSearchOptions& options, ScheduleKind kind, int stages, int micro_batches,
                   int chunks, int64_t checkpoint);

// Every layout that fits the memory cap, fastest first (ties: less memory first).
// ConfigError when none fits, naming the cap and the least memory any layout needs.
std::vector<Plan> search_plans(const PlanSearchOptions& options);

}  // namespace pipetrain::schedule
