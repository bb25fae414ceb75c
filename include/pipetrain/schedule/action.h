// One instruction of a pipeline schedule, its compact notation and its parser.
//
// Execution semantics shared by the validator, the simulator and the runtime (the stage
// executor implements exactly these):
//   - the actions of one stage run one at a time, in list order;
//   - a send never blocks its sender: the tensor is handed to the channel (buffered) and the
//     sender goes on with its next action once it is posted (the simulator can charge the
//     posting, CostModel::send);
//   - a receive blocks until the matching send has been issued and the transfer is done;
//   - a send to the same stage (a local hand-over between two model chunks, e.g. ZB-V's turn
//     on the last stage) moves the tensor without any channel and costs nothing.
// Under these rules a schedule is deadlock-free exactly when replaying it with any positive
// costs finishes (validate.h checks this).
//
// Compact notation (to_string / parse_action), one token per action, no spaces:
//
//   <stage><code>[<mb>][c<chunk>][#<slot>][>|<<peer stage>[c<peer chunk>]]
//
//   code  op                  mb   peer      code  op                  mb   peer
//   L     load_micro_batch    yes  -         SA    send_activation     yes  > to
//   F     forward             yes  -         RA    recv_activation     yes  < from
//   B     backward (full)     yes  -         SG    send_grad           yes  > to
//   I     backward_input      yes  -         RG    recv_grad           yes  < from
//   W     backward_weight     yes  -         T     reduce_tied_grads   no   -
//                                            R     reduce_grads        no   -
//                                            O     optimizer_step      no   -
//
// Omitted parts take their defaults: chunk 0, no slot, peer chunk 0. Examples: `2F5` = stage
// 2 forward micro-batch 5; `1I3c1#2` = stage 1 input-gradient backward of micro-batch 3 on
// its local chunk 1, buffer slot 2; `0SA4#1>1` = stage 0 sends micro-batch 4's activation
// from slot 1 to stage 1 (chunk 0); `3RG0c1#0<0c1` = stage 3 receives the gradient of
// micro-batch 0 for its chunk 1 from stage 0's chunk 1; `2O` = stage 2 optimizer step.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace pipetrain::schedule {

enum class Op : unsigned char {
  load_micro_batch,
  forward,
  backward,
  backward_input,
  backward_weight,
  send_activation,
  recv_activation,
  send_grad,
  recv_grad,
  reduce_tied_grads,
  reduce_grads,
  optimizer_step,
};
inline constexpr int kNumOps = 12;

// "forward", "send_activation", ...: the names of the JSON output and of trace events.
const char* op_name(Op op);
// "F", "SA", ...: the codes of the compact notation.
const char* op_code(Op op);
// Inverse of op_name; throws ScheduleError naming the valid names.
Op parse_op_name(std::string_view name);
// The op of a stored index (a trace row, a message); ScheduleError when it names none.
Op op_from_index(int index);

// Small predicates, inline because the validator calls them for every action.
constexpr bool is_step(Op op) {  // reduce_tied_grads, reduce_grads, optimizer_step
  return op == Op::reduce_tied_grads || op == Op::reduce_grads || op == Op::optimizer_step;
}
// The op refers to one micro-batch (everything except the three step ops).
constexpr bool has_micro_batch(Op op) { return !is_step(op); }
constexpr bool is_backward(Op op) {  // backward, backward_input, backward_weight
  return op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}
// Forward and the three backward kinds: the ops that take compute time.
constexpr bool is_compute(Op op) { return op == Op::forward || is_backward(op); }
constexpr bool is_send(Op op) { return op == Op::send_activation || op == Op::send_grad; }
constexpr bool is_recv(Op op) { return op == Op::recv_activation || op == Op::recv_grad; }
constexpr bool is_comm(Op op) { return is_send(op) || is_recv(op); }

// One instruction for one stage. Everything the stage executor needs is in here; it never
// has to know which generator made the schedule.
struct Action {
  Op op = Op::forward;
  int stage = 0;         // the stage that runs it
  int micro_batch = -1;  // -1 for the step ops
  int chunk = 0;         // local model-chunk index on `stage` (Layout maps it to a virtual stage)
  int slot = -1;         // activation buffer slot on `stage`; -1: none assigned
  int peer_stage = -1;   // send: destination, recv: source; -1 for non-comm ops
  int peer_chunk = -1;   // the peer's local chunk; -1 for non-comm ops

  bool operator==(const Action& other) const;
  bool operator!=(const Action& other) const { return !(*this == other); }
};

// Empty when `a` is well formed: a micro-batch exactly where the op has one, a peer exactly on
// send/recv, no negative index except the -1 "none" values. Otherwise, what is wrong.
std::string malformation(const Action& a);

// The compact notation above. For every well-formed action, parse_action(to_string(a)) == a.
std::string to_string(const Action& a);
// Throws ScheduleError naming the text and the expected form.
Action parse_action(std::string_view text);
// Whitespace-separated actions, e.g. a row written by hand in a test.
std::vector<Action> parse_actions(std::string_view text);

// The op, micro-batch and chunk only (`F5`, `I3c1`, `O`): labels for tables and timelines.
std::string short_label(const Action& a);

std::ostream& operator<<(std::ostream& out, const Action& a);
std::ostream& operator<<(std::ostream& out, Op op);

}  // namespace pipetrain::schedule
