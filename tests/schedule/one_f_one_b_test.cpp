// 1F1B (DeepSpeed TrainSchedule / PipeDream-Flush): golden orders, actions, memory bound.
#include <gtest/gtest.h>

#include <algorithm>

#include "pipetrain/schedule/format.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"
#include "schedule/timeline_text.h"

namespace pipetrain::schedule {
namespace {

Schedule one_f_one_b(int P, int M) {
  return generate(ScheduleOptions(ScheduleKind::one_f_one_b, P, M));
}

TEST(OneFOneB, GoldenComputeOrderTwoStagesFourMicroBatches) {
  EXPECT_EQ(format_compute_table(one_f_one_b(2, 4)),
            "stage 0: F0 F1 B0 F2 B1 F3 B2 B3\n"
            "stage 1: F0 B0 F1 B1 F2 B2 F3 B3\n");
}

TEST(OneFOneB, GoldenComputeOrderFourStagesEightMicroBatches) {
  EXPECT_EQ(format_compute_table(one_f_one_b(4, 8)),
            "stage 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"
            "stage 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
            "stage 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n"
            "stage 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n");
}

TEST(OneFOneB, GoldenComputeOrderFewerMicroBatchesThanStages) {
  EXPECT_EQ(format_compute_table(one_f_one_b(4, 2)),
            "stage 0: F0 F1 B0 B1\n"
            "stage 1: F0 F1 B0 B1\n"
            "stage 2: F0 F1 B0 B1\n"
            "stage 3: F0 B0 F1 B1\n");
}

// Every action, with loads, transfers, slots and the step at the end.
TEST(OneFOneB, GoldenActionsTwoStagesTwoMicroBatches) {
  const Schedule s = one_f_one_b(2, 2);
  EXPECT_EQ(format_text(s),
            "1f1b: 2 stages, 2 micro-batches, 1 chunk(s) per stage (looped layout); buffers per "
            "stage: 2 1\n"
            "stage 0: 0L0#0 0F0#0 0SA0#0>1 0L1#1 0F1#1 0SA1#1>1 0RG0#0<1 0B0#0 0RG1#1<1 0B1#1 "
            "0T 0R 0O\n"
            "stage 1: 1RA0#0<0 1L0#0 1F0#0 1B0#0 1SG0#0>0 1RA1#0<0 1L1#0 1F1#0 1B1#0 1SG1#0>0 "
            "1T 1R 1O\n");
}

// F = 1, full backward = 2 (B = W = 1), no transfer cost: the textbook picture, with the
// (P - 1) (F + B + W) = 9 idle units on every stage.
TEST(OneFOneB, GoldenTimelineFourStagesEightMicroBatches) {
  const Schedule s = one_f_one_b(4, 8);
  const SimulationResult r = simulate(s, CostModel::uniform(4, 1, 1, 1, 0));
  // Trailing idle units are not drawn: stage 3 ends at 27, six units before the others.
  EXPECT_EQ(testing::timeline_text(r),
            "stage 0: F0 F1 F2 F3  .  .  .  .  .  . B0 B0 F4 B1 B1 F5 B2 B2 F6 B3 B3 F7 B4 B4"
            "  . B5 B5  . B6 B6  . B7 B7\n"
            "stage 1:  . F0 F1 F2  .  .  .  . B0 B0 F3 B1 B1 F4 B2 B2 F5 B3 B3 F6 B4 B4 F7 B5"
            " B5  . B6 B6  . B7 B7\n"
            "stage 2:  .  . F0 F1  .  . B0 B0 F2 B1 B1 F3 B2 B2 F4 B3 B3 F5 B4 B4 F6 B5 B5 F7"
            " B6 B6  . B7 B7\n"
            "stage 3:  .  .  . F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6"
            " F7 B7 B7\n");
  EXPECT_DOUBLE_EQ(r.makespan, 33);
  for (double b : r.bubble) EXPECT_DOUBLE_EQ(b, 9.0 / 33.0);
}

TEST(OneFOneB, BuffersAndLiveActivationsAreMinOfStagesLeftAndMicroBatches) {
  for (int P : {1, 2, 3, 5, 8}) {
    for (int M : {1, 2, 3, 4, 7, 16}) {
      const Schedule s = one_f_one_b(P, M);
      const auto live = peak_live_activations(s);
      for (int j = 0; j < P; ++j) {
        EXPECT_EQ(s.buffers[j], std::min(P - j, M)) << "P=" << P << " M=" << M << " j=" << j;
        EXPECT_EQ(live[j], std::min(P - j, M)) << "P=" << P << " M=" << M << " j=" << j;
      }
    }
  }
}

TEST(OneFOneB, SingleStageRunsForwardBackwardPerMicroBatch) {
  const Schedule s = one_f_one_b(1, 3);
  EXPECT_EQ(format_text(s, 0).substr(format_text(s, 0).find('\n') + 1),
            "stage 0: 0L0#0 0F0#0 0B0#0 0L1#0 0F1#0 0B1#0 0L2#0 0F2#0 0B2#0 0T 0R 0O\n");
  validate(s);
}

}  // namespace
}  // namespace pipetrain::schedule
