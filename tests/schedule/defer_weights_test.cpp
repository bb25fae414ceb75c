// defer_weight_gradients: B -> I in place, W just before the step ops, still a valid schedule.
#include "pipetrain/schedule/defer_weights.h"

#include <gtest/gtest.h>

#include "pipetrain/schedule/generate.h"
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
      EXPECT_GT(first_weight, last_compute_other);
      EXPECT_LT(first_weight, first_step);
      EXPECT_EQ(actions.size(), original.stages[j].size() + static_cast<size_t>(weights));
    }
  }
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
