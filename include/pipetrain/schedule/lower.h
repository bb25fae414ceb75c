// From a compute order to a full schedule: data loads, sends, receives, buffer slots, step.
//
// A generator only decides in which order each stage runs its forwards and backwards; this
// pass adds everything else the same way for every schedule. Around each compute step on
// virtual stage v (of N = P * V):
//
//   forward:   [recv_activation from v-1]  [load_micro_batch if v == 0 or v == N-1]
//              forward  [send_activation to v+1]
//   backward / backward_input:
//              [recv_grad from v+1]  backward(_input)  [send_grad to v-1]
//   backward_weight: alone (it needs nothing from another stage)
//
// Receives sit right before the action that consumes them (they block), sends right after
// the action that produces them (they never block). Training schedules end each stage with
// reduce_tied_grads, reduce_grads, optimizer_step.
//
// Buffer slots: the activation of (chunk, micro-batch) occupies one slot from its first action
// (receive or load) to its last (send_grad, backward or backward_weight, whichever comes
// last); a freed slot is reused by the next micro-batch that starts, lowest index first, so
// `buffers[stage]` is the largest number of micro-batches a stage holds at once.
#pragma once

#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

struct ComputeStep {
  Op op = Op::forward;  // forward, backward, backward_input or backward_weight
  int chunk = 0;
  int micro_batch = 0;
};

// Per stage, the compute steps in execution order.
using ComputeOrder = std::vector<std::vector<ComputeStep>>;

// Throws ScheduleError when `order` has a stage count other than the layout's or a step that
// is not a compute op.
Schedule lower(ScheduleKind kind, bool training, int num_micro_batches, const Layout& layout,
               const ComputeOrder& order);

// Recomputes every stage's slots and `buffers` from the action order (as lower() does).
void assign_slots(Schedule& schedule);

// Per position of stages[stage]: true where the action is the last one touching its
// (chunk, micro-batch), so an executor may drop that slot's tensors right after running it
// instead of holding them until the slot is reused.
std::vector<bool> slot_released_after(const Schedule& schedule, int stage);

}  // namespace pipetrain::schedule
