// Properties over random kinds, stage and micro-batch counts: valid, bounded, closed forms.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>

#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::fill_drain, ScheduleKind::one_f_one_b,
                                   ScheduleKind::inference,  ScheduleKind::interleaved,
                                   ScheduleKind::zb_h1,      ScheduleKind::zb_v,
                                   ScheduleKind::dualpipe_v, ScheduleKind::v_half,
                                   ScheduleKind::v_min};

struct Params {
  ScheduleKind kind;
  int stages;
  int micro_batches;
  int chunks;
  LayoutKind layout;
};

// Any kind with P in 1..16, M in 1..64 and a chunk count the kind accepts.
rc::Gen<Params> params() {
  return rc::gen::exec([] {
    Params p;
    p.kind = *rc::gen::elementOf(std::vector<ScheduleKind>(std::begin(kKinds), std::end(kKinds)));
    p.stages = *rc::gen::inRange(1, 17);
    p.micro_batches = *rc::gen::inRange(1, 65);
    // DualPipeV needs M >= 2P (as torch's ScheduleDualPipeV).
    if (p.kind == ScheduleKind::dualpipe_v) p.micro_batches = std::max(p.micro_batches, 2 * p.stages);
    p.chunks = p.kind == ScheduleKind::interleaved ? *rc::gen::inRange(1, 5)
               : p.kind == ScheduleKind::inference ? *rc::gen::inRange(1, 4)
               : is_v_shaped(p.kind)               ? 2
                                                   : 1;
    p.layout = is_v_shaped(p.kind) ? LayoutKind::v_shape : LayoutKind::looped;
    if (p.kind == ScheduleKind::inference && *rc::gen::arbitrary<bool>())
      p.layout = LayoutKind::v_shape;
    return p;
  });
}

Schedule make(const Params& p) {
  ScheduleOptions options(p.kind, p.stages, p.micro_batches);
  options.chunks(p.chunks);
  if (p.kind == ScheduleKind::inference) options.layout(p.layout);
  return generate(options);
}

double equal_cost_bubble(const Schedule& s) {
  return simulate(s, CostModel::uniform(s.num_stages(), 1, 1, 1, 0)).bubble_overall;
}

RC_GTEST_PROP(ScheduleProperty, EveryGeneratedScheduleValidates, ()) {
  const Params p = *params();
  const Schedule s = make(p);
  const auto problem = find_problem(s);
  if (problem) RC_FAIL(describe_problem(s, *problem));
  RC_ASSERT(s.num_stages() == p.stages);
  RC_ASSERT(s.num_chunks() == p.chunks);
}

RC_GTEST_PROP(ScheduleProperty, EveryActionPrintsAndParsesBack, ()) {
  const Schedule s = make(*params());
  for (const auto& actions : s.stages)
    for (const Action& a : actions) RC_ASSERT(parse_action(to_string(a)) == a);
}

RC_GTEST_PROP(ScheduleProperty, OneFOneBHoldsAtMostMinOfStagesLeftAndMicroBatches, ()) {
  const int P = *rc::gen::inRange(1, 17);
  const int M = *rc::gen::inRange(1, 65);
  const Schedule s = generate(ScheduleOptions(ScheduleKind::one_f_one_b, P, M));
  const auto live = peak_live_activations(s);
  for (int j = 0; j < P; ++j) {
    RC_ASSERT(live[j] == std::min(P - j, M));
    RC_ASSERT(s.buffers[j] == std::min(P - j, M));
  }
}

RC_GTEST_PROP(ScheduleProperty, ZeroBubbleKindsKeepOneFOneBsPeakMemory, ()) {
  const int P = *rc::gen::inRange(1, 17);
  const int M = *rc::gen::inRange(1, 65);
  const int peak = std::min(P, M);  // 1F1B's, on stage 0
  const Schedule h1 = generate(ScheduleOptions(ScheduleKind::zb_h1, P, M));
  const auto live = peak_live_activations(h1);
  RC_ASSERT(*std::max_element(live.begin(), live.end()) <= peak);
  RC_ASSERT(*std::max_element(h1.buffers.begin(), h1.buffers.end()) <= peak);
  const Schedule v = generate(ScheduleOptions(ScheduleKind::zb_v, P, M));
  const auto memory = simulate(v, CostModel::uniform(P, 1, 1, 1, 0)).peak_activation_memory;
  RC_ASSERT(*std::max_element(memory.begin(), memory.end()) <= peak);
}

RC_GTEST_PROP(ScheduleProperty, SimulatedBubbleEqualsTheClosedForm, ()) {
  const Params p = *params();
  if (p.kind == ScheduleKind::inference && p.chunks != 1) return;
  const int P = p.stages;
  const int M = p.micro_batches;
  const int V = p.chunks;
  const double bubble = equal_cost_bubble(make(p));
  switch (p.kind) {
    case ScheduleKind::fill_drain:
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::inference:
      RC_ASSERT(std::fabs(bubble - (P - 1.0) / (M + P - 1.0)) < 1e-9);
      break;
    case ScheduleKind::interleaved: {
      // The closed form holds for M a multiple of P; check it there by rounding M up.
      const int rounded = (M + P - 1) / P * P;
      Params q = p;
      q.micro_batches = rounded;
      const double closed = (P - 1.0) / (V * rounded + P - 1.0);
      RC_ASSERT(std::fabs(equal_cost_bubble(make(q)) - closed) < 1e-9);
      // Any M: never worse than plain 1F1B.
      RC_ASSERT(bubble <= (P - 1.0) / (M + P - 1.0) + 1e-9);
      break;
    }
    case ScheduleKind::zb_h1: {
      // Makespan 3M + P - 1 (M >= P), plus P - M while the pipeline never fills (M < P).
      const double makespan = 3.0 * M + P - 1 + std::max(0, P - M);
      RC_ASSERT(std::fabs(bubble - (1.0 - 3.0 * M / makespan)) < 1e-9);
      break;
    }
    case ScheduleKind::zb_v: {
      const double h1 = equal_cost_bubble(generate(ScheduleOptions(ScheduleKind::zb_h1, P, M)));
      RC_ASSERT(bubble <= h1 + 1e-9);
      break;
    }
    case ScheduleKind::dualpipe_v:
      // Never above 1F1B's (v_schedules_test pins it closer at P = 4, M = 8).
      RC_ASSERT(bubble <= (P - 1.0) / (M + P - 1.0) + 1e-9);
      break;
    case ScheduleKind::v_half:
    case ScheduleKind::v_min:
      // They trade bubble for memory (v_schedules_test checks the memory); the replay still
      // keeps every stage busy at least a third of the time.
      RC_ASSERT(bubble < 1.0);
      break;
    case ScheduleKind::custom:
      break;
  }
}

RC_GTEST_PROP(ScheduleProperty, AnyPositiveCostsFinishWithinTheSerialTime, ()) {
  const Params p = *params();
  const Schedule s = make(p);
  CostModel costs = CostModel::uniform(p.stages, 0, 0, 0, 0);
  double serial = 0;
  for (int j = 0; j < p.stages; ++j) {
    costs.forward[j] = *rc::gen::inRange(1, 100) / 10.0;
    costs.backward_input[j] = *rc::gen::inRange(1, 100) / 10.0;
    costs.backward_weight[j] = *rc::gen::inRange(0, 100) / 10.0;
    costs.transfer[j] = *rc::gen::inRange(0, 30) / 10.0;
    serial +=
        (costs.forward[j] + (s.training ? costs.backward_input[j] + costs.backward_weight[j] : 0) +
         2.0 * p.chunks * costs.transfer[j]) *
        p.micro_batches;
  }
  const SimulationResult r = simulate(s, costs);
  // Each stage's work fits in the makespan, and no schedule is slower than running every
  // step and transfer one after the other.
  for (int j = 0; j < p.stages; ++j) {
    RC_ASSERT(r.busy[j] <= r.makespan + 1e-9);
    RC_ASSERT(r.bubble[j] >= -1e-9);
  }
  RC_ASSERT(r.makespan <= serial + 1e-6);
}

}  // namespace
}  // namespace pipetrain::schedule
