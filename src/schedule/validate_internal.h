// The validator's passes, one file each (internal to the layer).
#pragma once

#include <optional>

#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule::detail {

// Checks 1 and 2 of validate.h on one stage.
std::optional<ScheduleProblem> check_stage_order(const Schedule& schedule, int stage);
// Check 3: sends and receives pair up.
std::optional<ScheduleProblem> check_matching(const Schedule& schedule);
// Check 4 on one stage.
std::optional<ScheduleProblem> check_stage_complete(const Schedule& schedule, int stage);
// Check 5 on one stage.
std::optional<ScheduleProblem> check_stage_slots(const Schedule& schedule, int stage);
// Check 6.
std::optional<ScheduleProblem> check_deadlock(const Schedule& schedule);

// Dense index of (chunk, micro-batch) on a stage.
inline size_t key_of(const Schedule& s, int chunk, int micro_batch) {
  return static_cast<size_t>(chunk) * s.num_micro_batches + micro_batch;
}

// "micro-batch 3" or "micro-batch 3 chunk 1" when the schedule has several chunks.
std::string what(const Schedule& s, int chunk, int micro_batch);

}  // namespace pipetrain::schedule::detail
