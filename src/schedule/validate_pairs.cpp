// Validator passes: sends pair with receives, work is complete, slots are not overwritten.
#include <fmt/format.h>

#include <array>
#include <vector>

#include "replay.h"
#include "validate_internal.h"

namespace pipetrain::schedule::detail {
namespace {

// The op that receives what `send` sends, and back.
Op counterpart(Op op) {
  switch (op) {
    case Op::send_activation:
      return Op::recv_activation;
    case Op::recv_activation:
      return Op::send_activation;
    case Op::send_grad:
      return Op::recv_grad;
    default:
      return Op::send_grad;
  }
}

}  // namespace

std::optional<ScheduleProblem> check_matching(const Schedule& s) {
  // The stage that sent / received each message (the position is looked up on error only).
  std::vector<int> sent(message_count(s), -1);
  std::vector<int> received(message_count(s), -1);
  auto position_of = [&](int stage, const Action& like, bool send) {
    const auto& actions = s.stages[stage];
    for (int k = 0; k < static_cast<int>(actions.size()); ++k)
      if (is_send(actions[k].op) == send && is_comm(actions[k].op) &&
          message_of(s, actions[k]) == message_of(s, like))
        return k;
    return -1;
  };
  for (int j = 0; j < s.num_stages(); ++j) {
    for (int k = 0; k < static_cast<int>(s.stages[j].size()); ++k) {
      const Action& a = s.stages[j][k];
      if (!is_comm(a.op)) continue;
      auto& by = is_send(a.op) ? sent : received;
      const size_t m = message_of(s, a);
      if (by[m] >= 0) {
        const int first = position_of(by[m], a, is_send(a.op));
        return ScheduleProblem{j,
                               k,
                               fmt::format("second {} of this message (the first is stage {} "
                                           "position {})",
                                           op_name(a.op), by[m], first),
                               {{by[m], first}}};
      }
      by[m] = j;
    }
  }
  for (int j = 0; j < s.num_stages(); ++j) {
    for (int k = 0; k < static_cast<int>(s.stages[j].size()); ++k) {
      const Action& a = s.stages[j][k];
      if (!is_comm(a.op)) continue;
      const size_t m = message_of(s, a);
      if ((is_send(a.op) ? received[m] : sent[m]) >= 0) continue;
      if (is_send(a.op))
        return ScheduleProblem{j,
                               k,
                               fmt::format("unmatched send: stage {} never runs the matching {} "
                                           "of {}",
                                           a.peer_stage, op_name(counterpart(a.op)),
                                           what(s, a.peer_chunk, a.micro_batch)),
                               {}};
      return ScheduleProblem{j,
                             k,
                             fmt::format("waits for a message never sent: stage {} has no {} of "
                                         "{} to this stage",
                                         a.peer_stage, op_name(counterpart(a.op)),
                                         what(s, a.peer_chunk, a.micro_batch)),
                             {}};
    }
  }
  return std::nullopt;
}

std::optional<ScheduleProblem> check_stage_complete(const Schedule& s, int j) {
  const auto& actions = s.stages[j];
  const int M = s.num_micro_batches;
  const int V = s.num_chunks();
  const int last = s.layout.num_virtual_stages() - 1;
  constexpr int kOps = 9;
  std::vector<std::array<int, kOps>> at(static_cast<size_t>(V) * M);
  for (auto& row : at) row.fill(-1);
  for (int k = 0; k < static_cast<int>(actions.size()); ++k) {
    const Action& a = actions[k];
    if (has_micro_batch(a.op)) at[key_of(s, a.chunk, a.micro_batch)][static_cast<int>(a.op)] = k;
  }
  for (int c = 0; c < V; ++c) {
    const int v = s.layout.virtual_stage(j, c);
    for (int i = 0; i < M; ++i) {
      const auto& pos = at[key_of(s, c, i)];
      const auto has = [&](Op op) { return pos[static_cast<int>(op)] >= 0; };
      const auto where = [&](Op op) { return pos[static_cast<int>(op)]; };
      const auto mb = [&] { return what(s, c, i); };
      if (!has(Op::forward))
        return ScheduleProblem{j, -1, fmt::format("{} is never forwarded", mb()), {}};
      if (v < last && !has(Op::send_activation))
        return ScheduleProblem{j,
                               where(Op::forward),
                               fmt::format("the output of {} is never sent on (no "
                                           "send_activation to virtual stage {})",
                                           mb(), v + 1),
                               {}};
      if (!s.training) continue;
      if (!has(Op::backward) && !has(Op::backward_input))
        return ScheduleProblem{
            j, where(Op::forward), fmt::format("{} is forwarded but never backwarded", mb()), {}};
      const Op grad_op = has(Op::backward) ? Op::backward : Op::backward_input;
      if (grad_op == Op::backward_input && !has(Op::backward_weight))
        return ScheduleProblem{j,
                               where(grad_op),
                               fmt::format("backward_input of {} has no backward_weight", mb()),
                               {}};
      if (v > 0 && !has(Op::send_grad))
        return ScheduleProblem{j,
                               where(grad_op),
                               fmt::format("the input gradient of {} is never sent back (no "
                                           "send_grad to virtual stage {})",
                                           mb(), v - 1),
                               {}};
    }
  }
  return std::nullopt;
}

std::optional<ScheduleProblem> check_stage_slots(const Schedule& s, int j) {
  const auto& actions = s.stages[j];
  std::vector<int> last_use(static_cast<size_t>(s.num_chunks()) * s.num_micro_batches, -1);
  for (int k = 0; k < static_cast<int>(actions.size()); ++k)
    if (has_micro_batch(actions[k].op))
      last_use[key_of(s, actions[k].chunk, actions[k].micro_batch)] = k;
  std::vector<int> holder(s.buffers[j], -1);  // position of the holder's first action
  for (int k = 0; k < static_cast<int>(actions.size()); ++k) {
    const Action& a = actions[k];
    if (!has_micro_batch(a.op)) continue;
    const size_t key = key_of(s, a.chunk, a.micro_batch);
    int& h = holder[a.slot];
    if (h >= 0) {
      const Action& owner = actions[h];
      const size_t owner_key = key_of(s, owner.chunk, owner.micro_batch);
      if (owner_key != key && last_use[owner_key] > k)
        return ScheduleProblem{
            j,
            k,
            fmt::format("overwrites slot {}, which still holds {}: its last use is position {} "
                        "({})",
                        a.slot, what(s, owner.chunk, owner.micro_batch), last_use[owner_key],
                        to_string(actions[last_use[owner_key]])),
            {{j, last_use[owner_key]}}};
      if (owner_key == key) continue;
    }
    h = k;
  }
  return std::nullopt;
}

}  // namespace pipetrain::schedule::detail
