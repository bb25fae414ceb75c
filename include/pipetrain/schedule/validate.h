// The validator: is a schedule executable, complete and within its buffers?
//
// Checked, under the execution semantics of action.h, in this order:
//   1. every action is well formed, on its own stage's list, with indices in range and a
//      buffer slot below the stage's `buffers`; comm peers are the layout's neighbours;
//   2. each action's inputs come earlier on the same stage: forward after its receive (and
//      its load on the first / last virtual stage), sends after what they send, a backward
//      after its forward and its output gradient, backward_weight after backward_input;
//      loads in increasing micro-batch order per chunk; the step actions last, in order;
//   3. every send has exactly one matching receive and every receive one send;
//   4. each (chunk, micro-batch) is forwarded exactly once per stage and, when training,
//      backwarded exactly once (a full backward, or backward_input + backward_weight);
//   5. a buffer slot is never reused while the micro-batch in it has actions still to come;
//   6. no deadlock: replaying with positive costs finishes.
// A problem is reported with the stage, the position in its list and the action, plus the
// step-by-stage grid around it with the offending action marked.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

struct ScheduleProblem {
  int stage = -1;     // -1: the schedule as a whole
  int position = -1;  // index into stages[stage]; -1: the stage as a whole
  std::string reason;
  std::vector<std::pair<int, int>> related;  // other (stage, position) involved, e.g. a cycle
};

// The first problem found, or nothing when the schedule is valid.
std::optional<ScheduleProblem> find_problem(const Schedule& schedule);

// Throws ScheduleError with describe_problem()'s text when find_problem() finds one.
void validate(const Schedule& schedule);

// "invalid 1f1b schedule (...): stage 1, position 4, action 1B0#0: <reason>" and the grid.
std::string describe_problem(const Schedule& schedule, const ScheduleProblem& problem);

// Per stage: the most micro-batch activations held at once, counted per (chunk, micro-batch):
// live from the start of its forward until its backward (or backward_weight) ends; in an
// inference schedule only during the forward. Needs no costs: a stage runs its list in order.
std::vector<int> peak_live_activations(const Schedule& schedule);

}  // namespace pipetrain::schedule
