// DualPipeV, V-Half and V-Min: golden orders, their rules, and the memory each promises.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <string>

#include "pipetrain/error.h"
#include "pipetrain/schedule/format.h"
#include "pipetrain/schedule/generate.h"
#include "schedule/make_schedule.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

using testing::make;

int max_of(const std::vector<int>& v) { return *std::max_element(v.begin(), v.end()); }

TEST(DualPipeV, GoldenOrderTwoStagesFourMicroBatches) {
  // Stage 1 (the turn): F0 F0c1 pairs, then (F0 B1)(F1 B0) overlapped pairs run in order,
  // the cool-down's second half split into I and W.
  const Schedule s = make(ScheduleKind::dualpipe_v, 2, 4);
  EXPECT_EQ(s.layout.kind(), LayoutKind::v_shape);
  // clang-format off
  EXPECT_EQ(format_compute_table(s),
            "stage 0: F0   F1   F2   F0c1 I0c1 W0c1 F1c1 F3   B1c1 F2c1 B0   B2c1 F3c1 B1   B3c1 I2   W2   I3   W3\n"
            "stage 1: F0   F0c1 F1   F1c1 F2   B0c1 F2c1 B0   F3   B1c1 F3c1 B1   B2c1 B2   I3c1 I3   W3c1 W3\n");
  // clang-format on
  EXPECT_EQ(peak_live_activations(s), (std::vector<int>{5, 5}));
}

TEST(DualPipeV, NeedsTwiceAsManyMicroBatchesAsStages) {
  try {
    make(ScheduleKind::dualpipe_v, 4, 7);
    FAIL() << "expected ScheduleError";
  } catch (const ScheduleError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("at least 2P = 8 micro-batches for 4 stages"), std::string::npos) << what;
    EXPECT_NE(what.find("got 7"), std::string::npos) << what;
    EXPECT_NE(what.find("--micro-batches 8"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(make(ScheduleKind::dualpipe_v, 4, 8));
}

TEST(VSchedules, TakeExactlyTwoChunksInAV) {
  for (ScheduleKind kind : {ScheduleKind::dualpipe_v, ScheduleKind::v_half, ScheduleKind::v_min}) {
    SCOPED_TRACE(kind_name(kind));
    EXPECT_EQ(parse_kind(kind_name(kind)), kind);
    EXPECT_THROW(generate(ScheduleOptions(kind, 2, 4).chunks(3)), ScheduleError);
    EXPECT_THROW(generate(ScheduleOptions(kind, 2, 4).layout(LayoutKind::looped)), ScheduleError);
    EXPECT_EQ(generate(ScheduleOptions(kind, 2, 4)).num_chunks(), 2);
  }
}

// Simulated with F = B = W = 1: P = 4, M = 8 (the table in docs/schedule.md).
TEST(VSchedules, MemoryAndBubbleAtFourStagesEightMicroBatches) {
  const auto run = [](ScheduleKind kind) {
    return simulate(make(kind, 4, 8), CostModel::uniform(4, 1, 1, 1, 0));
  };
  const auto zb_v = run(ScheduleKind::zb_v);
  const auto dual = run(ScheduleKind::dualpipe_v);
  const auto half = run(ScheduleKind::v_half);
  const auto min = run(ScheduleKind::v_min);
  EXPECT_EQ(max_of(zb_v.peak_live_activations), 8);  // 1F1B's 4 whole stages
  EXPECT_EQ(max_of(dual.peak_live_activations), 9);
  EXPECT_EQ(max_of(half.peak_live_activations), 4);  // half
  EXPECT_EQ(max_of(min.peak_live_activations), 3);   // ceil(2P/3)
  EXPECT_NEAR(dual.bubble_overall, zb_v.bubble_overall, 1e-9);
  EXPECT_LT(half.bubble_overall, 0.27);  // below 1F1B's 27.3%
}

// The bounds the generators guarantee, over P <= 16 and M <= 64.
RC_GTEST_PROP(VSchedulesProperty, VHalfAndVMinKeepTheirMemoryBound, ()) {
  const int P = *rc::gen::inRange(1, 17);
  const int M = *rc::gen::inRange(1, 65);
  const Schedule half = make(ScheduleKind::v_half, P, M);
  const Schedule min = make(ScheduleKind::v_min, P, M);
  RC_ASSERT(max_of(peak_live_activations(half)) <= std::max(2, P));
  RC_ASSERT(max_of(peak_live_activations(min)) <= std::max(2, (2 * P + 2) / 3));
  RC_ASSERT(max_of(half.buffers) <= std::max(2, P));
}

RC_GTEST_PROP(VSchedulesProperty, DualPipeVHoldsAtMostOneMoreThanZbV, ()) {
  const int P = *rc::gen::inRange(1, 17);
  const int M = *rc::gen::inRange(2 * P, 2 * P + 49);
  const Schedule s = make(ScheduleKind::dualpipe_v, P, M);
  const auto live = peak_live_activations(s);
  RC_ASSERT(max_of(live) <= 2 * P + 1);
  // Its bubble with equal costs is never above 1F1B's.
  const double bubble = simulate(s, CostModel::uniform(P, 1, 1, 1, 0)).bubble_overall;
  RC_ASSERT(bubble <= (P - 1.0) / (M + P - 1.0) + 1e-9);
}

}  // namespace
}  // namespace pipetrain::schedule
