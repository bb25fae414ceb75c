// B -> I now, W in the first cool-down wait or at the end of the step.
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
    // Cool-down: after its last forward a stage waits for each gradient from downstream. The
    // weight gradients of the micro-batches already through their I fill the first such wait
    // (grouped by chunk so the executor fuses them); the rest run at the end.
    size_t last_forward = body.size();
    for (size_t k = 0; k < body.size(); ++k) {
      if (body[k].op == Op::forward) last_forward = k;
    }
    size_t cool = body.size();
    for (size_t k = last_forward == body.size() ? body.size() : last_forward + 1; k < body.size(); ++k) {
      if (body[k].op == Op::recv_grad) {
        cool = k;
        break;
      }
    }
    std::vector<Action> early, late;
    for (const auto& w : weights) {
      const bool input_done =
          std::any_of(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(cool), [&](const Action& a) {
            return a.op == Op::backward_input && a.chunk == w.chunk && a.micro_batch == w.micro_batch;
          });
      (input_done ? early : late).push_back(w);
    }
    std::stable_sort(early.begin(), early.end(), [](const Action& a, const Action& b) { return a.chunk < b.chunk; });
    body.insert(body.begin() + static_cast<std::ptrdiff_t>(cool), early.begin(), early.end());
    body.insert(body.end(), late.begin(), late.end());
    body.insert(body.end(), tail.begin(), tail.end());
    stage = std::move(body);
  }
  assign_slots(out);
  validate(out);
  return out;
}

}  // namespace pipetrain::schedule
