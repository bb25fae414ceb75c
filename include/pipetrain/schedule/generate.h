// The schedule generators: parameters in, a lowered, slot-assigned Schedule out.
//
// Letters: P = stages, M = micro-batches, V = chunks per stage, j = stage, i = micro-batch.
// Every generator accepts any P >= 1 and M >= 1 (including M < P); where a kind has a rule on
// V, the ScheduleError says which values to use instead.
//
//   kind          chunks  layout   compute order per stage (see docs/schedule.md)
//   fill-drain    1       looped   F0..F(M-1), then B(M-1)..B0 (GPipe / torchgpipe)
//   1f1b          1       looped   min(P-j-1, M) warm-up F, then F/B pairs, then the last B
//   inference     V >= 1  any      forwards only, micro-batches in groups of P per chunk
//   interleaved   V >= 2  looped   Megatron: groups of P micro-batches per chunk, warm-up
//                                  2(P-j-1) + (V-1)P forwards (V = 1 gives 1f1b)
//   zb-h1         1       looped   1F1B with B = backward_input; stage j defers j
//                                  backward_weight steps into the cool-down bubble
//   zb-v          2       v_shape  Qi et al.'s V: 2(P-j)-1 chunk-0 forwards, j forward pairs,
//                                  P-j chunk-1 F/I/W, then F I W per chunk (1F1B's memory)
//   dualpipev     2       v_shape  DeepSeek's DualPipeV as torch's ScheduleDualPipeV: warm-up
//                                  forwards, then forward of one chunk + full backward of the
//                                  other, split I/W in the cool-down; needs M >= 2P
//   v-half        2       v_shape  controllable-memory V (Qi et al.): at most max(2, P) chunk
//                                  activations per stage (half of 1F1B's 2P), greedy placement
//   v-min         2       v_shape  the same within max(2, ceil(2P/3)): a third, more bubble
#pragma once

#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// Required values in the constructor, the rest chained:
//   generate(ScheduleOptions(ScheduleKind::interleaved, 4, 8).chunks(2))
struct ScheduleOptions {
  ScheduleOptions(ScheduleKind kind, int num_stages, int num_micro_batches)
      : kind_(kind), num_stages_(num_stages), num_micro_batches_(num_micro_batches) {}

  // 0 (the default) = the kind's default: 2 for interleaved and zb-v, 1 otherwise.
  ScheduleOptions& chunks(int v) {
    num_chunks_ = v;
    return *this;
  }
  // Only inference may choose (to evaluate a model laid out for zb-v); the other kinds
  // fix their layout and reject a different one.
  ScheduleOptions& layout(LayoutKind kind) {
    layout_ = kind;
    layout_set_ = true;
    return *this;
  }

  ScheduleKind kind() const { return kind_; }
  int num_stages() const { return num_stages_; }
  int num_micro_batches() const { return num_micro_batches_; }
  int num_chunks() const;  // resolved default
  LayoutKind layout_kind() const;
  bool layout_set() const { return layout_set_; }

 private:
  ScheduleKind kind_;
  int num_stages_;
  int num_micro_batches_;
  int num_chunks_ = 0;
  LayoutKind layout_ = LayoutKind::looped;
  bool layout_set_ = false;
};

// Checks the options (ConfigError for P < 1 or M < 1, ScheduleError for a chunk count or
// layout the kind does not support) and runs the kind's generator. The result is valid
// (validate() passes; the property tests check this over many parameters).
Schedule generate(const ScheduleOptions& options);

// The compute orders behind each kind (no checks beyond P, M, V >= 1).
ComputeOrder fill_drain_order(int num_stages, int num_micro_batches);
ComputeOrder one_f_one_b_order(int num_stages, int num_micro_batches);
ComputeOrder inference_order(const Layout& layout, int num_micro_batches);
ComputeOrder interleaved_order(int num_stages, int num_micro_batches, int num_chunks);
ComputeOrder zb_h1_order(int num_stages, int num_micro_batches);
ComputeOrder zb_v_order(int num_stages, int num_micro_batches);
ComputeOrder dualpipe_v_order(int num_stages, int num_micro_batches);  // M >= 2P
ComputeOrder v_half_order(int num_stages, int num_micro_batches);
ComputeOrder v_min_order(int num_stages, int num_micro_batches);
// The greedy placement behind v-half and v-min (v_memory_orders.cpp): unit-time list
// scheduling of the V with F on chunk 0 admitted only while the stage holds fewer than
// `admit_below` chunk activations (>= 1), and stage 0 starting micro-batch i no earlier than
// step i * interval; eager_weights runs each W before any forward (lazy: only when nothing
// else can run). `steps`: when the replay finished.
struct CappedOrder {
  ComputeOrder order;
  int steps = 0;
};
CappedOrder capped_v_order(int num_stages, int num_micro_batches, int admit_below, int interval,
                           bool eager_weights);
// The most chunk activations (forward done, backward_weight not yet) a stage of `order` holds.
int peak_chunk_activations(const ComputeOrder& order);

// The micro-batch groups of the interleaved and inference orders: consecutive runs of P
// micro-batches, the remainder joining the last group (Megatron's schedule table); a
// single group of M when M < P. Returns each group's first micro-batch, plus M at the end.
std::vector<int> micro_batch_groups(int num_stages, int num_micro_batches);

}  // namespace pipetrain::schedule
