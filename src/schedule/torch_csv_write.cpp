// Writing a schedule as torch.distributed.pipelining's CSV (see torch_csv.h).
#include <fmt/format.h>

#include <string>

#include "pipetrain/schedule/torch_csv.h"

namespace pipetrain::schedule {
namespace {

// torch's _Action text of one of our actions, or "" where torch has no equivalent (loads,
// step actions, hand-overs between two chunks of one rank).
std::string torch_cell(const Schedule& s, const Action& a, bool with_comm) {
  const auto& layout = s.layout;
  const int v = layout.virtual_stage(a.stage, a.chunk);
  switch (a.op) {
    case Op::forward:
      return fmt::format("{}F{}", v, a.micro_batch);
    case Op::backward:
      return fmt::format("{}B{}", v, a.micro_batch);
    case Op::backward_input:
      return fmt::format("{}I{}", v, a.micro_batch);
    case Op::backward_weight:
      return fmt::format("{}W{}", v, a.micro_batch);
    default:
      break;
  }
  if (!with_comm || !is_comm(a.op) || a.peer_stage == a.stage) return "";
  // Sends carry the sender's stage, receives the receiver's, as torch's lowering writes them.
  switch (a.op) {
    case Op::send_activation:
      return fmt::format("{}SEND_F{}", v, a.micro_batch);
    case Op::recv_activation:
      return fmt::format("{}RECV_F{}", v, a.micro_batch);
    case Op::send_grad:
      return fmt::format("{}SEND_B{}", v, a.micro_batch);
    case Op::recv_grad:
      return fmt::format("{}RECV_B{}", v, a.micro_batch);
    default:
      return "";
  }
}

}  // namespace

std::string to_torch_csv(const Schedule& schedule, bool with_comm) {
  std::string out;
  for (const auto& actions : schedule.stages) {
    std::string row;
    for (const Action& a : actions) {
      const std::string cell = torch_cell(schedule, a, with_comm);
      if (cell.empty()) continue;
      if (!row.empty()) row += ',';
      row += cell;
    }
    out += row + '\n';
  }
  return out;
}

}  // namespace pipetrain::schedule
