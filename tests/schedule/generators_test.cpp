// Fill-drain, inference, interleaved, ZB-H1 and ZB-V: golden orders, timelines and options.
#include <gtest/gtest.h>

#include <algorithm>

#include "pipetrain/error.h"
#include "pipetrain/schedule/format.h"
#include "pipetrain/schedule/generate.h"
#include "schedule/make_schedule.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"
#include "schedule/timeline_text.h"

namespace pipetrain::schedule {
namespace {

using testing::make;

TEST(FillDrain, AllForwardsThenBackwardsInReverse) {
  const Schedule s = make(ScheduleKind::fill_drain, 3, 4);
  EXPECT_EQ(format_compute_table(s),
            "stage 0: F0 F1 F2 F3 B3 B2 B1 B0\n"
            "stage 1: F0 F1 F2 F3 B3 B2 B1 B0\n"
            "stage 2: F0 F1 F2 F3 B3 B2 B1 B0\n");
  EXPECT_EQ(s.buffers, (std::vector<int>{4, 4, 4}));
  const auto r = simulate(s, CostModel::uniform(3, 1, 1, 1, 0));
  EXPECT_EQ(testing::timeline_text(r),
            "stage 0: F0 F1 F2 F3  .  .  .  .  .  . B3 B3 B2 B2 B1 B1 B0 B0\n"
            "stage 1:  . F0 F1 F2 F3  .  .  . B3 B3 B2 B2 B1 B1 B0 B0\n"
            "stage 2:  .  . F0 F1 F2 F3 B3 B3 B2 B2 B1 B1 B0 B0\n");
}

TEST(Inference, ForwardsOnlyOneBufferNoStep) {
  const Schedule s = make(ScheduleKind::inference, 2, 3);
  EXPECT_FALSE(s.training);
  EXPECT_EQ(format_text(s).substr(format_text(s).find('\n') + 1),
            "stage 0: 0L0#0 0F0#0 0SA0#0>1 0L1#0 0F1#0 0SA1#0>1 0L2#0 0F2#0 0SA2#0>1\n"
            "stage 1: 1RA0#0<0 1L0#0 1F0#0 1RA1#0<0 1L1#0 1F1#0 1RA2#0<0 1L2#0 1F2#0\n");
  EXPECT_EQ(s.buffers, (std::vector<int>{1, 1}));
  EXPECT_EQ(peak_live_activations(s), (std::vector<int>{1, 1}));
}

TEST(Inference, EvaluatesAModelLaidOutForZbV) {
  const Schedule s = generate(
      ScheduleOptions(ScheduleKind::inference, 2, 2).chunks(2).layout(LayoutKind::v_shape));
  validate(s);
  // Stage 0 loads the inputs for chunk 0 and the labels for chunk 1 (the last virtual stage).
  EXPECT_EQ(format_text(s, 0).substr(format_text(s, 0).find('\n') + 1),
            "stage 0: 0L0#0 0F0#0 0SA0#0>1 0L1#0 0F1#0 0SA1#0>1 0RA0c1#0<1c1 0L0c1#0 0F0c1#0 "
            "0RA1c1#0<1c1 0L1c1#0 0F1c1#0\n");
}

TEST(Interleaved, GoldenMegatronOrderTwoStagesTwoChunks) {
  // Groups of P = 2 micro-batches per chunk; warm-up 2(P-j-1) + (V-1)P forwards.
  // clang-format off
  EXPECT_EQ(format_compute_table(make(ScheduleKind::interleaved, 2, 4, 2)),
            "stage 0: F0   F1   F0c1 F1c1 F2   B0c1 F3   B1c1 F2c1 B0   F3c1 B1   B2c1 B3c1 B2   B3\n"
            "stage 1: F0   F1   F0c1 B0c1 F1c1 B1c1 F2   B0   F3   B1   F2c1 B2c1 F3c1 B3c1 B2   B3\n");
  // clang-format on
}

TEST(Interleaved, GoldenTimelineShowsTheShorterWarmUp) {
  // Each chunk holds half a stage: F = 2 and B + W = 4 per stage make 1 and 2 per chunk.
  const auto r =
      simulate(make(ScheduleKind::interleaved, 2, 4, 2), CostModel::uniform(2, 2, 2, 2, 0));
  EXPECT_EQ(testing::timeline_text(r, 5),
            "stage 0:   F0   F1 F0c1 F1c1   F2    . B0c1 B0c1   F3 B1c1 B1c1 F2c1   B0   B0 F3c1"
            "   B1   B1    . B2c1 B2c1    . B3c1 B3c1   B2   B2   B3   B3\n"
            "stage 1:    .   F0   F1 F0c1 B0c1 B0c1 F1c1 B1c1 B1c1   F2   B0   B0   F3   B1   B1"
            " F2c1 B2c1 B2c1 F3c1 B3c1 B3c1   B2   B2   B3   B3\n");
  // (V M + P - 1) / V (F + B + W) = 27, against 1F1B's (M + P - 1)(F + B + W) = 30.
  EXPECT_DOUBLE_EQ(r.makespan, 27);
}

TEST(Interleaved, RemainderJoinsTheFirstGroup) {
  EXPECT_EQ(micro_batch_groups(4, 8), (std::vector<int>{0, 4, 8}));
  EXPECT_EQ(micro_batch_groups(4, 11), (std::vector<int>{0, 7, 11}));
  EXPECT_EQ(micro_batch_groups(4, 13), (std::vector<int>{0, 5, 9, 13}));
  EXPECT_EQ(micro_batch_groups(4, 3), (std::vector<int>{0, 3}));
  EXPECT_EQ(micro_batch_groups(4, 6), (std::vector<int>{0, 6}));
}

TEST(Interleaved, FewerMicroBatchesThanStagesRunsAllForwardsFirst) {
  EXPECT_EQ(format_compute_table(make(ScheduleKind::interleaved, 3, 2, 2)),
            "stage 0: F0   F1   F0c1 F1c1 B0c1 B1c1 B0   B1\n"
            "stage 1: F0   F1   F0c1 F1c1 B0c1 B1c1 B0   B1\n"
            "stage 2: F0   F1   F0c1 B0c1 F1c1 B1c1 B0   B1\n");
}

TEST(Interleaved, OneChunkIsPlainOneFOneB) {
  const Schedule a = make(ScheduleKind::interleaved, 3, 5, 1);
  const Schedule b = make(ScheduleKind::one_f_one_b, 3, 5);
  EXPECT_EQ(a.stages, b.stages);
}

TEST(ZbH1, GoldenOrderDefersStageJsWeightGradientsByJ) {
  EXPECT_EQ(format_compute_table(make(ScheduleKind::zb_h1, 4, 8)),
            "stage 0: F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7\n"
            "stage 1: F0 F1 F2 I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7\n"
            "stage 2: F0 F1 I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7\n"
            "stage 3: F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7\n");
}

TEST(ZbH1, GoldenTimelineFillsTheCoolDownWithWeightGradients) {
  const auto r = simulate(make(ScheduleKind::zb_h1, 4, 8), CostModel::uniform(4, 1, 1, 1, 0));
  EXPECT_EQ(testing::timeline_text(r),
            "stage 0: F0 F1 F2 F3  .  .  . I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6"
            " I7 W7\n"
            "stage 1:  . F0 F1 F2  .  . I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7"
            " W6 W7\n"
            "stage 2:  .  . F0 F1  . I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5"
            " W6 W7\n"
            "stage 3:  .  .  . F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5"
            " W6 W7\n");
  // (P - 1) idle units per stage instead of 1F1B's 3 (P - 1).
  EXPECT_DOUBLE_EQ(r.makespan, 27);
  const auto ones =
      simulate(make(ScheduleKind::one_f_one_b, 4, 8), CostModel::uniform(4, 1, 1, 1, 0));
  EXPECT_EQ(peak_live_activations(make(ScheduleKind::zb_h1, 4, 8)), (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(*std::max_element(ones.peak_live_activations.begin(), ones.peak_live_activations.end()),
            4);
}

TEST(ZbV, GoldenOrderTwoStages) {
  EXPECT_EQ(format_compute_table(make(ScheduleKind::zb_v, 2, 4)),
            "stage 0: F0   F1   F2   F0c1 I0c1 W0c1 F1c1 I1c1 W1c1 F3   I0   W0   F2c1 I2c1 W2c1 "
            "I1   W1   F3c1 I3c1 W3c1 I2   W2   I3   W3\n"
            "stage 1: F0   F0c1 F1   F1c1 I0c1 W0c1 F2   I0   W0   F2c1 I1c1 W1c1 F3   I1   W1   "
            "F3c1 I2c1 W2c1 I2   I3c1 I3   W2   W3c1 W3\n");
}

TEST(ZbV, StageZeroHoldsFirstAndLastVirtualStageAndLoadsBoth) {
  const Schedule s = make(ScheduleKind::zb_v, 3, 4);
  EXPECT_EQ(s.layout.kind(), LayoutKind::v_shape);
  EXPECT_TRUE(s.layout.is_last(0, 1));
  int inputs = 0, labels = 0;
  for (const Action& a : s.stages[0]) {
    if (a.op != Op::load_micro_batch) continue;
    (a.chunk == 0 ? inputs : labels)++;
  }
  EXPECT_EQ(inputs, 4);
  EXPECT_EQ(labels, 4);
  // The turn on the last stage is a local hand-over to its own chunk 1.
  const auto& last = s.stages[2];
  EXPECT_NE(std::find(last.begin(), last.end(), parse_action("2SA0#0>2c1")), last.end())
      << format_text(s, 2);
}

TEST(ZbV, KeepsOneFOneBMemoryAndBeatsZbH1AtEqualCosts) {
  for (int P : {2, 4, 6}) {
    for (int M : {1, 3, 8, 16}) {
      const auto v = simulate(make(ScheduleKind::zb_v, P, M), CostModel::uniform(P, 1, 1, 1, 0));
      const auto h = simulate(make(ScheduleKind::zb_h1, P, M), CostModel::uniform(P, 1, 1, 1, 0));
      EXPECT_LE(v.bubble_overall, h.bubble_overall + 1e-12) << "P=" << P << " M=" << M;
      for (double memory : v.peak_activation_memory) EXPECT_LE(memory, std::min(P, M));
    }
  }
}

TEST(Generate, ChunkRulesNameTheKindToUse) {
  try {
    make(ScheduleKind::one_f_one_b, 4, 8, 2);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("--kind interleaved"), std::string::npos) << e.what();
  }
  try {
    make(ScheduleKind::zb_v, 4, 8, 3);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("--chunks 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make(ScheduleKind::interleaved, 4, 8, -1), ScheduleError);
  EXPECT_THROW(generate(ScheduleOptions(ScheduleKind::zb_v, 2, 2).layout(LayoutKind::looped)),
               ScheduleError);
  EXPECT_THROW(generate(ScheduleOptions(ScheduleKind::custom, 2, 2)), ScheduleError);
}

TEST(Generate, RejectsNonPositiveSizesAsConfigErrors) {
  try {
    make(ScheduleKind::one_f_one_b, 0, 8);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--stages must be at least 1, got 0"), std::string::npos);
  }
  EXPECT_THROW(make(ScheduleKind::fill_drain, 2, 0), ConfigError);
  EXPECT_THROW(make(ScheduleKind::fill_drain, 100000, 100000), ScheduleError);
}

TEST(Generate, KindNamesRoundTrip) {
  for (ScheduleKind kind :
       {ScheduleKind::fill_drain, ScheduleKind::one_f_one_b, ScheduleKind::inference,
        ScheduleKind::interleaved, ScheduleKind::zb_h1, ScheduleKind::zb_v})
    EXPECT_EQ(parse_kind(kind_name(kind)), kind);
  try {
    parse_kind("gpipe");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fill-drain|1f1b|inference|interleaved|zb-h1|zb-v"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::schedule
