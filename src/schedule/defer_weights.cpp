// B -> I now, W at the end of the step.
#include "pipetrain/schedule/defer_weights.h"

#include <algorithm>

#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {

Schedule defer_weight_gradients(const Schedule& schedule) {
  bool has_full = false;
  for (const auto& stage : schedule.stages) {
    for (const auto& a : stage) has_full = has_full || a.op == Op::backward;
  }
  if (!has_full) return schedule;

  Schedule out = schedule;
  for (auto& stage : out.stages) {
    std::vector<Action> body;
    std::vector<Action> weights;
    std::vector<Action> tail;
    for (const auto& a : stage) {
      if (is_step(a.op)) {
        tail.push_back(a);
        continue;
      }
      Action copy = a;
      if (a.op == Op::backward) {
        copy.op = Op::backward_input;
        Action w = a;
        w.op = Op::backward_weight;
        weights.push_back(w);
      }
      body.push_back(copy);
    }
    body.insert(body.end(), weights.begin(), weights.end());
    body.insert(body.end(), tail.begin(), tail.end());
    stage = std::move(body);
  }
  assign_slots(out);
  validate(out);
  return out;
}

}  // namespace pipetrain::schedule
