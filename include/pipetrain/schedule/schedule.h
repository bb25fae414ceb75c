// A schedule as plain data: for each stage, the ordered list of actions it executes.
#pragma once

#include <string_view>
#include <vector>

#include "pipetrain/schedule/action.h"
#include "pipetrain/schedule/layout.h"

namespace pipetrain::schedule {

enum class ScheduleKind {
  fill_drain,   // GPipe: all forwards, then all backwards
  one_f_one_b,  // DeepSpeed TrainSchedule / PipeDream-Flush
  inference,    // forwards only
  interleaved,  // Megatron interleaved 1F1B, V looped chunks per stage
  zb_h1,        // zero bubble H1: split backward, W deferred, 1F1B memory
  zb_v,         // zero bubble V: two chunks per stage in a V
  dualpipe_v,   // DeepSeek's DualPipeV: V, overlapped F/B pairs of the two chunks, M >= 2P
  v_half,       // controllable-memory V (Qi et al.): about half of 1F1B's activation memory
  v_min,        // controllable-memory V (Qi et al.): about a third of 1F1B's activation memory
  custom,       // written by hand or by a generator outside this library
};

// "fill-drain", "1f1b", "inference", "interleaved", "zb-h1", "zb-v", "dualpipev", "v-half",
// "v-min", "custom".
const char* kind_name(ScheduleKind kind);
// Inverse of kind_name; throws ConfigError listing the accepted names.
ScheduleKind parse_kind(std::string_view name);
// Every kind but inference computes gradients and ends with the step actions.
bool is_training(ScheduleKind kind);
// The kinds that place two chunks per stage in a V (LayoutKind::v_shape).
bool is_v_shaped(ScheduleKind kind);
// Every kind that trains and has a generator, in kind order (the planner tries each): a new
// kind added to the list of kinds in schedule.cpp is planned for without further change.
std::vector<ScheduleKind> training_kinds();

struct Schedule {
  ScheduleKind kind = ScheduleKind::custom;
  bool training = true;  // backwards and the reduce/step actions are expected
  int num_micro_batches = 1;
  Layout layout;                            // stages, chunks per stage, their virtual stages
  std::vector<std::vector<Action>> stages;  // index = stage; each in execution order
  std::vector<int> buffers;                 // activation buffer slots each stage needs

  int num_stages() const { return layout.num_stages(); }
  int num_chunks() const { return layout.num_chunks(); }
  size_t num_actions() const;
};

}  // namespace pipetrain::schedule
