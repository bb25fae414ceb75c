// defer_weight_gradients: B -> I in place, W just before the step ops, still a valid schedule.
#include "pipetrain/schedule/defer_weights.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

TEST(DeferWeights, SplitsEveryBackwardAndMovesWeightsBeforeTheStep) {
  for (auto kind : {ScheduleKind::one_f_one_b, ScheduleKind::fill_drain, ScheduleKind::interleaved}) {
    SCOPED_TRACE(kind_name(kind));
    const auto original = generate(ScheduleOptions(kind, 3, 6));
    const auto deferred = defer_weight_gradients(original);
    EXPECT_NO_THROW(validate(deferred));
    for (int j = 0; j < deferred.num_stages(); ++j) {
      const auto& actions = deferred.stages[j];
      int inputs = 0, weights = 0, backwards = 0;
      size_t first_weight = actions.size(), last_compute_other = 0, first_step = actions.size();
      for (size_t k = 0; k < actions.size(); ++k) {
        const auto op = actions[k].op;
        if (op == Op::backward) ++backwards;
        if (op == Op::backward_input) ++inputs, last_compute_other = k;
        if (op == Op::forward) last_compute_other = k;
        if (op == Op::backward_weight) {
          ++weights;
          first_weight = std::min(first_weight, k);
        }
        if (is_step(op)) first_step = std::min(first_step, k);
      }
      EXPECT_EQ(backwards, 0);
      EXPECT_EQ(inputs, 6 * original.num_chunks());
      EXPECT_EQ(weights, inputs);
      EXPECT_LT(first_weight, first_step);
      // Every W follows its own I; only W whose I is done may run before the last I.
      for (size_t k = 0; k < actions.size(); ++k) {
        if (actions[k].op != Op::backward_weight) continue;
        bool input_before = false;
        for (size_t q = 0; q < k; ++q) {
          input_before = input_before || (actions[q].op == Op::backward_input &&
                                          actions[q].micro_batch == actions[k].micro_batch &&
                                          actions[q].chunk == actions[k].chunk);
        }
        EXPECT_TRUE(input_before) << "stage " << j << " action " << k;
      }
      (void)last_compute_other;
      EXPECT_EQ(actions.size(), original.stages[j].size() + static_cast<size_t>(weights));
    }
  }
}

TEST(DeferWeights, FillsTheFirstCoolDownWaitWithFinishedWeights) {
  // 1F1B, 2 stages, 8 micro-batches: stage 0 runs F7 with I0..I5 done, then waits for the
  // gradient of micro-batch 6. The last stage never waits for a gradient.
  const auto deferred = defer_weight_gradients(generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 8)));
  const auto& first = deferred.stages[0];
  size_t last_forward = 0;
  for (size_t k = 0; k < first.size(); ++k) {
    if (first[k].op == Op::forward) last_forward = k;
  }
  size_t k = last_forward + 1;
  while (k < first.size() && first[k].op != Op::backward_weight) ++k;
  for (int mb = 0; mb < 6; ++mb, ++k) {
    ASSERT_LT(k, first.size());
    EXPECT_EQ(first[k].op, Op::backward_weight);
    EXPECT_EQ(first[k].micro_batch, mb);
  }
  ASSERT_LT(k, first.size());
  EXPECT_EQ(first[k].op, Op::recv_grad);
  EXPECT_EQ(first[k].micro_batch, 6);
  const auto& last = deferred.stages[1];
  size_t last_input = 0, first_weight = last.size();
  for (size_t q = 0; q < last.size(); ++q) {
    if (last[q].op == Op::backward_input) last_input = q;
    if (last[q].op == Op::backward_weight) first_weight = std::min(first_weight, q);
  }
  EXPECT_GT(first_weight, last_input);
  // The simulator agrees that the wait is gone: the step is shorter than with every W at the end.
  const auto costs = CostModel::uniform(2, 1.0, 1.0, 1.0, 0.0);
  auto all_at_end = deferred;
  for (auto& stage : all_at_end.stages) {
    std::stable_partition(stage.begin(), stage.end(), [](const Action& a) {
      return a.op != Op::backward_weight && !is_step(a.op);
    });
  }
  assign_slots(all_at_end);
  EXPECT_LT(simulate(deferred, costs).makespan, simulate(all_at_end, costs).makespan);
}

TEST(DeferWeights, LeavesSplitSchedulesAlone) {
  const auto zb = generate(ScheduleOptions(ScheduleKind::zb_h1, 4, 8));
  const auto same = defer_weight_gradients(zb);
  EXPECT_EQ(same.stages, zb.stages);
  const auto inference = generate(ScheduleOptions(ScheduleKind::inference, 2, 4));
  EXPECT_EQ(defer_weight_gradients(inference).stages, inference.stages);
}

TEST(DeferWeights, ShortensTheCriticalPathWhenWeightsAreExpensive) {
  // With W as costly as I, upstream stages get their gradients sooner.
  const auto original = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 8));
  const auto costs = CostModel::uniform(2, 1.0, 1.0, 1.0, 0.0);
  const double before = simulate(original, costs).makespan;
  const double after = simulate(defer_weight_gradients(original), costs).makespan;
  EXPECT_LT(after, before);
}

}  // namespace
}  // namespace pipetrain::schedule
