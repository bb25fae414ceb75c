// The memory model against peaks computed by hand from the schedules' tables.
#include "pipetrain/schedule/memory.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"
#include "pipetrain/schedule/defer_weights.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

std::vector<StageMemory> same(int P, double fixed, double activation, double transient = 0) {
  return std::vector<StageMemory>(static_cast<size_t>(P), StageMemory{fixed, activation, transient});
}

// 2 stages, 4 micro-batches. fill-drain holds all 4 on both stages; 1F1B holds P - j:
//   1f1b stage 0:  F0 F1 B0 F2 B1 F3 B2 B3   live at most 2
//   1f1b stage 1:  F0 B0 F1 B1 F2 B2 F3 B3   live at most 1
TEST(MemoryModel, OneFOneBHoldsStagesMinusJWhereFillDrainHoldsEveryMicroBatch) {
  const auto fill = generate(ScheduleOptions(ScheduleKind::fill_drain, 2, 4));
  const auto ofob = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 4));
  EXPECT_EQ(peak_memory_bytes(fill, same(2, 100, 10)), (std::vector<double>{140, 140}));
  EXPECT_EQ(peak_memory_bytes(ofob, same(2, 100, 10)), (std::vector<double>{120, 110}));
}

// Checkpointing keeps 2 bytes per micro-batch instead of 10 and recomputes 8 while a backward
// runs: 1F1B's stage 0 peaks in B0 with F0, F1 held: 100 + 2 x 2 + 8 = 112 < 120.
TEST(MemoryModel, CheckpointingTradesHeldActivationsForOneRecompute) {
  const auto ofob = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 4));
  const auto plain = peak_memory_bytes(ofob, same(2, 100, 10));
  const auto ckpt = peak_memory_bytes(ofob, same(2, 100, 2, 8));
  EXPECT_EQ(ckpt, (std::vector<double>{112, 110}));
  EXPECT_LT(ckpt[0], plain[0]);
  // With many micro-batches in flight the saving grows: fill-drain 100 + 4 x 2 + 8 = 116 vs 140.
  const auto fill = generate(ScheduleOptions(ScheduleKind::fill_drain, 2, 4));
  EXPECT_EQ(peak_memory_bytes(fill, same(2, 100, 2, 8))[0], 116);
}

// A chunk holds 1/V of the stage's bytes per micro-batch: the count the validator reports,
// divided by V, times the bytes.
TEST(MemoryModel, ChunksHoldTheirShareAndAgreeWithPeakLiveActivations) {
  const auto s = generate(ScheduleOptions(ScheduleKind::interleaved, 2, 4).chunks(2));
  const auto live = peak_live_activations(s);
  const auto peak = peak_memory_bytes(s, same(2, 0, 8));
  for (int j = 0; j < 2; ++j) EXPECT_DOUBLE_EQ(peak[j], live[j] * 8.0 / 2) << "stage " << j;
}

// Deferred weight gradients: the graph goes at I, the fast path's kept inputs at W. The last
// stage of a deferred 1F1B has no cool-down wait, so all its Ws run before the step: its
// graph bytes peak at one micro-batch, its kept inputs at all four.
TEST(MemoryModel, DeferredWeightsHoldTheirInputsUntilW) {
  const auto s = defer_weight_gradients(generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 4)));
  EXPECT_EQ(peak_memory_bytes(s, same(2, 0, 10))[1], 10);
  EXPECT_EQ(peak_memory_bytes(s, {StageMemory{}, StageMemory{0, 0, 0, 10}})[1], 40);
}

TEST(MemoryModel, SimulateReportsBytesWhenGivenAMemoryModel) {
  const auto s = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 4));
  auto costs = CostModel::uniform(2, 1, 1, 1, 0);
  EXPECT_TRUE(simulate(s, costs).peak_memory_bytes.empty());
  costs.memory = same(2, 100, 10);
  EXPECT_EQ(simulate(s, costs).peak_memory_bytes, (std::vector<double>{120, 110}));
}

TEST(MemoryModel, OptimizerStateAndBadInputs) {
  EXPECT_EQ(optimizer_state_factor("Adam"), 2);
  EXPECT_EQ(optimizer_state_factor("adamw"), 2);
  EXPECT_EQ(optimizer_state_factor("SGD"), 0);
  EXPECT_EQ(optimizer_state_factor("SGD", 0.9), 1);
  EXPECT_THROW(optimizer_state_factor("Lion"), ConfigError);
  const auto s = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 4));
  EXPECT_THROW(peak_memory_bytes(s, same(3, 1, 1)), ConfigError);
  EXPECT_THROW(peak_memory_bytes(s, same(2, -1, 1)), ConfigError);
}

}  // namespace
}  // namespace pipetrain::schedule
