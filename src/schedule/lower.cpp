// Lowering a compute order to actions (comm, loads, step) and assigning buffer slots.
#include "pipetrain/schedule/lower.h"

#include <fmt/format.h>

#include <functional>
#include <queue>
#include <vector>

#include "pipetrain/error.h"

namespace pipetrain::schedule {
namespace {

std::vector<Action> lower_stage(int stage, bool training, const Layout& layout,
                                const std::vector<ComputeStep>& steps) {
  const int last = layout.num_virtual_stages() - 1;
  std::vector<Action> out;
  out.reserve(steps.size() * 3 + 3);
  auto add = [&](Op op, const ComputeStep& step, Placement peer = {-1, -1}) {
    Action a;
    a.op = op;
    a.stage = stage;
    a.micro_batch = step.micro_batch;
    a.chunk = step.chunk;
    a.peer_stage = peer.stage;
    a.peer_chunk = peer.chunk;
    out.push_back(a);
  };
  for (const ComputeStep& step : steps) {
    const int v = layout.virtual_stage(stage, step.chunk);
    switch (step.op) {
      case Op::forward:
        if (v > 0) add(Op::recv_activation, step, layout.placement(v - 1));
        if (v == 0 || v == last) add(Op::load_micro_batch, step);
        add(Op::forward, step);
        if (v < last) add(Op::send_activation, step, layout.placement(v + 1));
        break;
      case Op::backward:
      case Op::backward_input:
        if (v < last) add(Op::recv_grad, step, layout.placement(v + 1));
        add(step.op, step);
        if (v > 0) add(Op::send_grad, step, layout.placement(v - 1));
        break;
      case Op::backward_weight:
        add(Op::backward_weight, step);
        break;
      default:
        throw ScheduleError(
            fmt::format("lower: stage {} has a compute step with op {}; only "
                        "forward and the backward kinds are compute steps",
                        stage, op_name(step.op)));
    }
  }
  if (training) {
    for (Op op : {Op::reduce_tied_grads, Op::reduce_grads, Op::optimizer_step}) {
      Action a;
      a.op = op;
      a.stage = stage;
      out.push_back(a);
    }
  }
  return out;
}

// Interval colouring in order of start: optimal for intervals, so the slot count equals the
// largest number of overlapping lifetimes.
int assign_stage_slots(std::vector<Action>& actions, int num_chunks, int num_micro_batches) {
  const size_t keys = static_cast<size_t>(num_chunks) * num_micro_batches;
  std::vector<int> last_use(keys, -1);
  auto key_of = [&](const Action& a) {
    return static_cast<size_t>(a.chunk) * num_micro_batches + a.micro_batch;
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (!has_micro_batch(a.op)) continue;
    if (a.chunk < 0 || a.chunk >= num_chunks || a.micro_batch < 0 ||
        a.micro_batch >= num_micro_batches)
      throw ScheduleError(fmt::format(
          "assign_slots: stage {}, position {}, action {}: chunk or micro-batch outside {} "
          "chunks x {} micro-batches",
          a.stage, i, to_string(a), num_chunks, num_micro_batches));
    last_use[key_of(a)] = static_cast<int>(i);
  }
  std::vector<int> slot_of(keys, -1);
  std::priority_queue<int, std::vector<int>, std::greater<int>> free_slots;
  int used = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    Action& a = actions[i];
    if (!has_micro_batch(a.op)) continue;
    const size_t key = key_of(a);
    if (slot_of[key] < 0) {
      if (free_slots.empty()) {
        slot_of[key] = used++;
      } else {
        slot_of[key] = free_slots.top();
        free_slots.pop();
      }
    }
    a.slot = slot_of[key];
    if (last_use[key] == static_cast<int>(i)) free_slots.push(slot_of[key]);
  }
  return used;
}

}  // namespace

Schedule lower(ScheduleKind kind, bool training, int num_micro_batches, const Layout& layout,
               const ComputeOrder& order) {
  if (static_cast<int>(order.size()) != layout.num_stages())
    throw ScheduleError(fmt::format("lower: compute order has {} stages, the layout {}",
                                    order.size(), layout.num_stages()));
  Schedule schedule;
  schedule.kind = kind;
  schedule.training = training;
  schedule.num_micro_batches = num_micro_batches;
  schedule.layout = layout;
  schedule.stages.reserve(order.size());
  for (int stage = 0; stage < layout.num_stages(); ++stage)
    schedule.stages.push_back(lower_stage(stage, training, layout, order[stage]));
  assign_slots(schedule);
  return schedule;
}

void assign_slots(Schedule& schedule) {
  schedule.buffers.assign(schedule.stages.size(), 0);
  for (size_t stage = 0; stage < schedule.stages.size(); ++stage)
    schedule.buffers[stage] = assign_stage_slots(schedule.stages[stage], schedule.num_chunks(),
                                                 schedule.num_micro_batches);
}

std::vector<bool> slot_released_after(const Schedule& schedule, int stage) {
  const auto& actions = schedule.stages.at(stage);
  std::vector<bool> released(actions.size(), false);
  std::vector<char> seen(static_cast<size_t>(schedule.num_chunks()) * schedule.num_micro_batches,
                         0);
  for (size_t k = actions.size(); k-- > 0;) {
    const Action& a = actions[k];
    if (!has_micro_batch(a.op)) continue;
    char& key = seen[static_cast<size_t>(a.chunk) * schedule.num_micro_batches + a.micro_batch];
    if (!key) released[k] = true;
    key = 1;
  }
  return released;
}

}  // namespace pipetrain::schedule
