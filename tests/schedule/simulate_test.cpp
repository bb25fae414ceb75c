// The simulator against closed forms, hand-computed timings and its input checks.
#include "pipetrain/schedule/simulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pipetrain/error.h"
#include "pipetrain/schedule/defer_weights.h"
#include "pipetrain/schedule/generate.h"
#include "schedule/make_schedule.h"
#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {
namespace {

using testing::make;

double bubble(ScheduleKind kind, int P, int M, int V = 0, double F = 1, double B = 1, double W = 1,
              double C = 0) {
  return simulate(make(kind, P, M, V), CostModel::uniform(P, F, B, W, C)).bubble_overall;
}

TEST(Simulate, FillDrainAndOneFOneBMatchTheClosedForm) {
  for (auto [P, M] : {std::pair{4, 8}, {2, 1}, {8, 3}, {5, 32}}) {
    const double closed = (P - 1.0) / (M + P - 1.0);
    EXPECT_NEAR(bubble(ScheduleKind::fill_drain, P, M), closed, 1e-12);
    EXPECT_NEAR(bubble(ScheduleKind::one_f_one_b, P, M), closed, 1e-12);
    // The bubble fraction does not depend on the cost scale or on the F : B ratio.
    EXPECT_NEAR(bubble(ScheduleKind::one_f_one_b, P, M, 0, 3, 4, 2), closed, 1e-12);
  }
}

TEST(Simulate, InterleavingDividesTheBubbleByAboutV) {
  // (P - 1) / (V M + P - 1) when M is a multiple of P.
  EXPECT_NEAR(bubble(ScheduleKind::interleaved, 4, 8, 2), 3.0 / 19.0, 1e-12);
  EXPECT_NEAR(bubble(ScheduleKind::interleaved, 4, 16, 4), 3.0 / 67.0, 1e-12);
  const double ratio =
      bubble(ScheduleKind::one_f_one_b, 8, 64) / bubble(ScheduleKind::interleaved, 8, 64, 4);
  EXPECT_GT(ratio, 3.5);
  EXPECT_LT(ratio, 4.0);
}

TEST(Simulate, ZbH1IsAboutAThirdOfOneFOneBAtEqualCosts) {
  // (P - 1) / (3 M + P - 1) for M >= P.
  EXPECT_NEAR(bubble(ScheduleKind::zb_h1, 4, 8), 3.0 / 27.0, 1e-12);
  const double ratio =
      bubble(ScheduleKind::zb_h1, 8, 64) / bubble(ScheduleKind::one_f_one_b, 8, 64);
  EXPECT_GT(ratio, 1.0 / 3.0);
  EXPECT_LT(ratio, 0.36);
}

TEST(Simulate, ChunkCostsAreTheStageCostDividedByV) {
  const auto r =
      simulate(make(ScheduleKind::interleaved, 1, 1, 4), CostModel::uniform(1, 8, 4, 4, 5));
  // One stage: no transfer costs (all hand-overs are local), 4 chunks of F/4 + (B+W)/4.
  EXPECT_DOUBLE_EQ(r.makespan, 16);
  EXPECT_DOUBLE_EQ(r.bubble_overall, 0);
  EXPECT_EQ(r.peak_live_activations, (std::vector<int>{4}));
  EXPECT_EQ(r.peak_activation_memory, (std::vector<double>{1.0}));
}

TEST(Simulate, TransfersDelayTheReceiverNotTheSender) {
  // Two stages, one micro-batch, F = 1, B = 2 (+ W = 1), C = 0.5.
  const auto r =
      simulate(make(ScheduleKind::one_f_one_b, 2, 1), CostModel::uniform(2, 1, 2, 1, 0.5));
  const auto& s0 = r.timeline[0];
  const auto& s1 = r.timeline[1];
  // stage 0: 0L0 0F0 0SA0 0RG0 0B0 ...: the send takes no time on the sender.
  EXPECT_EQ(s0[2].action.op, Op::send_activation);
  EXPECT_DOUBLE_EQ(s0[2].start, 1);
  EXPECT_DOUBLE_EQ(s0[2].end, 1);
  // stage 1: the receive ends when the activation is there, 1 + 0.5.
  EXPECT_EQ(s1[0].action.op, Op::recv_activation);
  EXPECT_DOUBLE_EQ(s1[0].start, 0);
  EXPECT_DOUBLE_EQ(s1[0].end, 1.5);
  EXPECT_DOUBLE_EQ(s1[2].start, 1.5);  // forward
  EXPECT_DOUBLE_EQ(s1[3].end, 5.5);    // backward: 3 units
  // stage 0's backward starts when the gradient is there: 5.5 + 0.5.
  EXPECT_EQ(s0[4].action.op, Op::backward);
  EXPECT_DOUBLE_EQ(s0[4].start, 6);
  EXPECT_DOUBLE_EQ(r.makespan, 9);
  EXPECT_DOUBLE_EQ(r.busy[0], 4);
  EXPECT_NEAR(r.bubble[0], 5.0 / 9.0, 1e-12);
}

TEST(Simulate, PostingASendKeepsTheSenderAndDelaysTheMessage) {
  // As above, with every send taking 0.25 on its stage.
  CostModel costs = CostModel::uniform(2, 1, 2, 1, 0.5);
  costs.send = {0.25, 0.25};
  const auto r = simulate(make(ScheduleKind::one_f_one_b, 2, 1), costs);
  const auto& s0 = r.timeline[0];
  const auto& s1 = r.timeline[1];
  EXPECT_EQ(s0[2].action.op, Op::send_activation);
  EXPECT_DOUBLE_EQ(s0[2].start, 1);
  EXPECT_DOUBLE_EQ(s0[2].end, 1.25);
  EXPECT_DOUBLE_EQ(s1[0].end, 1.75);  // the transfer starts when the send is posted
  EXPECT_DOUBLE_EQ(s1[3].end, 5.75);
  EXPECT_EQ(s1[4].action.op, Op::send_grad);
  EXPECT_DOUBLE_EQ(s1[4].end, 6.0);
  EXPECT_DOUBLE_EQ(s0[4].start, 6.5);
  EXPECT_DOUBLE_EQ(r.makespan, 9.5);
  // Posting is not compute: it shows as bubble.
  EXPECT_DOUBLE_EQ(r.busy[0], 4);
  EXPECT_NEAR(r.bubble[0], 1 - 4 / 9.5, 1e-12);
  costs.send = {0.25};
  EXPECT_THROW(simulate(make(ScheduleKind::one_f_one_b, 2, 1), costs), ConfigError);
}

const TimedAction& find(const std::vector<TimedAction>& row, Op op, int mb) {
  for (const auto& t : row)
    if (t.action.op == op && t.action.micro_batch == mb) return t;
  throw std::runtime_error("no such action");
}

TEST(Simulate, QueuedWeightWorkFillsAWait) {
  // 1F1B on 2 stages, 2 micro-batches, weights deferred: W0 W1 before the step on both stages.
  const Schedule s = defer_weight_gradients(make(ScheduleKind::one_f_one_b, 2, 2));
  CostModel costs = CostModel::uniform(2, 1, 1, 1, 0);
  const auto plain = simulate(s, costs);
  EXPECT_DOUBLE_EQ(plain.makespan, 8);  // stage 0: I0 [3,4], waits for RG1 until 5, I1, W0 W1
  costs.fill_waits = true;
  const auto r = simulate(s, costs);
  // Stage 0 runs W0 while it waits for RG1 [4,5]; the group before the step has W1 left.
  ASSERT_EQ(r.fills[0].size(), 1u);
  EXPECT_DOUBLE_EQ(r.fills[0][0].start, 4);
  EXPECT_DOUBLE_EQ(r.fills[0][0].end, 5);
  EXPECT_EQ(r.fills[0][0].micro_batch, -1);
  EXPECT_TRUE(r.fills[1].empty());
  EXPECT_DOUBLE_EQ(find(r.timeline[0], Op::backward_weight, 0).start, 6);
  EXPECT_DOUBLE_EQ(find(r.timeline[0], Op::backward_weight, 1).end, 7);
  EXPECT_DOUBLE_EQ(r.makespan, 7);
  EXPECT_EQ(r.busy, plain.busy);
  EXPECT_NEAR(r.bubble_overall, 1.0 / 7.0, 1e-12);
  const BubbleStats stats = bubble_stats(r.events(), 2);
  EXPECT_DOUBLE_EQ(stats.overall, r.bubble_overall);
}

TEST(Simulate, AWeightGroupPausesWhenItsGradientArrives) {
  // 1F1B, 2 stages, 3 micro-batches, deferred: stage 0 runs 0F2 0SA2 [0W0] 0RG1 0I1 0RG2 0I2
  // [0W1 0W2] 0T. Stage 1's backward is slower (1.5), so RG1 arrives at 6, in the middle of W0.
  const Schedule s = defer_weight_gradients(make(ScheduleKind::one_f_one_b, 2, 3));
  CostModel costs = CostModel::uniform(2, 1, 1, 1, 0);
  costs.backward_input[1] = 1.5;
  costs.fill_waits = true;
  const auto r = simulate(s, costs);
  const auto& w0 = find(r.timeline[0], Op::backward_weight, 0);
  EXPECT_DOUBLE_EQ(w0.start, 5.5);
  EXPECT_DOUBLE_EQ(w0.end, 6);  // paused, half of W0 left
  EXPECT_DOUBLE_EQ(find(r.timeline[0], Op::backward_input, 1).start, 6);
  // Waiting for RG2 (arrives 8.5): the rest of W0, then W1.
  ASSERT_EQ(r.fills[0].size(), 1u);
  EXPECT_DOUBLE_EQ(r.fills[0][0].start, 7);
  EXPECT_DOUBLE_EQ(r.fills[0][0].end, 8.5);
  // The last group has only W2 left, split over its two actions.
  EXPECT_DOUBLE_EQ(find(r.timeline[0], Op::backward_weight, 1).start, 9.5);
  EXPECT_DOUBLE_EQ(find(r.timeline[0], Op::backward_weight, 2).end, 10.5);
  EXPECT_DOUBLE_EQ(r.busy[0], 9);
  EXPECT_DOUBLE_EQ(r.busy[1], 10.5);
  EXPECT_DOUBLE_EQ(r.makespan, 11.5);
}

TEST(Simulate, FillingConservesWorkAndNeverDelaysARun) {
  for (ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::fill_drain, ScheduleKind::interleaved,
                            ScheduleKind::zb_h1, ScheduleKind::zb_v}) {
    for (auto [P, M] : {std::pair{2, 8}, {4, 8}, {3, 5}}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + " P=" + std::to_string(P) + " M=" + std::to_string(M));
      const Schedule s = defer_weight_gradients(make(kind, P, M));
      CostModel costs = CostModel::uniform(P, 1, 1.25, 0.75, 0.1);
      costs.forward[P - 1] = 1.5;  // an uneven last stage makes waits of every kind
      costs.send.assign(P, 0.05);
      const auto plain = simulate(s, costs);
      costs.fill_waits = true;
      const auto filled = simulate(s, costs);
      for (int j = 0; j < P; ++j) EXPECT_NEAR(filled.busy[j], plain.busy[j], 1e-9) << "stage " << j;
      EXPECT_LE(filled.makespan, plain.makespan + 1e-9);
      EXPECT_NEAR(bubble_stats(filled.events(), P).overall, filled.bubble_overall, 1e-12);
    }
  }
}

TEST(Simulate, PerStageCostsMakeTheSlowestStageTheBottleneck) {
  CostModel costs = CostModel::uniform(3, 1, 1, 0, 0);
  costs.forward[1] = 3;
  costs.backward_input[1] = 3;
  const auto r = simulate(make(ScheduleKind::one_f_one_b, 3, 16), costs);
  // The slow stage idles only while the pipeline fills and drains.
  EXPECT_LT(r.bubble[1], r.bubble[0]);
  EXPECT_LT(r.bubble[1], r.bubble[2]);
  EXPECT_GE(r.makespan, 16 * 6.0);
  EXPECT_LT(r.makespan, 16 * 6.0 + 2 * 2 + 2 * 2 + 1e-9);
}

TEST(Simulate, EventsFeedBubbleStats) {
  const auto r = simulate(make(ScheduleKind::zb_h1, 3, 5), CostModel::uniform(3, 1, 1, 1, 0.25));
  const BubbleStats stats = bubble_stats(r.events(), 3);
  EXPECT_DOUBLE_EQ(stats.makespan, r.makespan);
  EXPECT_DOUBLE_EQ(stats.overall, r.bubble_overall);
  EXPECT_EQ(stats.busy, r.busy);
}

TEST(BubbleStats, MeasuredEventsWithAnOffsetOrigin) {
  // Two ranks measured in seconds since some epoch.
  const std::vector<TimedEvent> events = {
      {0, Op::forward, 0, 0, 100.0, 101.0},         {0, Op::send_activation, 0, 0, 101.0, 101.0},
      {1, Op::recv_activation, 0, 0, 100.0, 101.0}, {1, Op::forward, 0, 0, 101.0, 102.0},
      {1, Op::backward, 0, 0, 102.0, 104.0},        {0, Op::backward, 0, 0, 104.0, 106.0},
  };
  const BubbleStats stats = bubble_stats(events);
  EXPECT_DOUBLE_EQ(stats.makespan, 6);
  EXPECT_EQ(stats.busy, (std::vector<double>{3, 3}));
  EXPECT_DOUBLE_EQ(stats.overall, 0.5);
  EXPECT_DOUBLE_EQ(bubble_stats({}).overall, 0);
}

TEST(EstimateCosts, RecoversTheCostsOfASimulatedRun) {
  CostModel truth = CostModel::uniform(3, 1.5, 1, 0.5, 0.25);
  truth.forward[2] = 3;
  truth.backward_weight[1] = 2;
  truth.send = {0.125, 0.0625, 0.25};
  for (ScheduleKind kind : {ScheduleKind::zb_h1, ScheduleKind::zb_v}) {
    const Schedule schedule = make(kind, 3, 6);
    const auto measured = simulate(schedule, truth).events();
    const CostModel estimated =
        estimate_costs(measured, 3, kind == ScheduleKind::zb_v ? 2 : 1, 0.25);
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(estimated.forward[j], truth.forward[j], 1e-12);
      EXPECT_NEAR(estimated.backward_input[j], truth.backward_input[j], 1e-12);
      EXPECT_NEAR(estimated.backward_weight[j], truth.backward_weight[j], 1e-12);
      EXPECT_NEAR(estimated.send[j], truth.send[j], 1e-12);
    }
    // The estimated costs predict the run they came from.
    EXPECT_NEAR(simulate(schedule, estimated).bubble_overall, simulate(schedule, truth).bubble_overall, 1e-12);
  }
  // A stage without sends (one stage) posts nothing.
  EXPECT_EQ(estimate_costs(simulate(make(ScheduleKind::one_f_one_b, 1, 2), CostModel::uniform(1, 1, 1, 0, 0)).events(), 1, 1).send,
            (std::vector<double>{0.0}));
  // Weight-gradient work done while filling a wait (micro-batch -1) counts toward W's time,
  // not as another W: cutting a part off every W gives the same costs.
  auto cut = simulate(make(ScheduleKind::zb_h1, 3, 6), truth).events();
  for (size_t i = 0, n = cut.size(); i < n; ++i) {
    if (cut[i].op != Op::backward_weight) continue;
    TimedEvent fill = cut[i];
    fill.micro_batch = -1;
    fill.start = cut[i].end - 0.2;
    cut[i].end = fill.start;
    cut.push_back(fill);
  }
  EXPECT_NEAR(estimate_costs(cut, 3, 1, 0.25).backward_weight[1], truth.backward_weight[1], 1e-12);
  // Full backwards are booked as input-gradient cost; re-simulating gives the same run.
  const Schedule ones = make(ScheduleKind::one_f_one_b, 3, 6);
  const CostModel full = estimate_costs(simulate(ones, truth).events(), 3, 1, 0.25);
  EXPECT_NEAR(full.backward_input[1], 3.0, 1e-12);
  EXPECT_EQ(full.backward_weight[1], 0.0);
  EXPECT_NEAR(simulate(ones, full).makespan, simulate(ones, truth).makespan, 1e-9);
  EXPECT_THROW(estimate_costs({}, 2, 1), ConfigError);
}

TEST(EstimateTransfer, RecoversTheTransferCostOfASimulatedRun) {
  CostModel truth = CostModel::uniform(3, 1.5, 1, 0.5, 0.25);
  truth.forward[2] = 3;  // stage 2 is slow: some receives arrive before they are waited for
  for (ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1, ScheduleKind::zb_v,
                            ScheduleKind::interleaved}) {
    SCOPED_TRACE(kind_name(kind));
    const Schedule schedule = make(kind, 3, 6);
    EXPECT_NEAR(estimate_transfer(schedule, simulate(schedule, truth).events()), 0.25, 1e-12);
    const CostModel instant = CostModel::uniform(3, 1.5, 1, 0.5, 0.0);
    EXPECT_NEAR(estimate_transfer(schedule, simulate(schedule, instant).events()), 0.0, 1e-12);
  }
  EXPECT_EQ(estimate_transfer(make(ScheduleKind::one_f_one_b, 2, 4), {}), 0.0);
}

TEST(SlotRelease, MarksTheLastActionOfEachMicroBatch) {
  const Schedule s = make(ScheduleKind::one_f_one_b, 2, 2);
  // stage 1: 1RA0 1L0 1F0 1B0 1SG0 1RA1 1L1 1F1 1B1 1SG1 1T 1R 1O
  const auto released = slot_released_after(s, 1);
  const std::vector<bool> expected = {false, false, false, false, true,  false, false,
                                      false, false, true,  false, false, false};
  EXPECT_EQ(released, expected);
}

TEST(Simulate, RejectsBadCostsNamingThem) {
  const Schedule s = make(ScheduleKind::one_f_one_b, 2, 2);
  try {
    simulate(s, CostModel::uniform(2, -1, 1, 1, 0));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("forward of stage 0 is -1"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(simulate(s, CostModel::uniform(3, 1, 1, 1, 0)), ConfigError);
  EXPECT_THROW(simulate(s, CostModel::uniform(2, 1, std::numeric_limits<double>::infinity(), 1, 0)),
               ConfigError);
  Schedule broken = s;
  std::swap(broken.stages[1][0], broken.stages[1][2]);
  EXPECT_THROW(simulate(broken, CostModel::uniform(2, 1, 1, 1, 0)), ScheduleError);
}

TEST(Simulate, ZeroCostsGiveZeroMakespanWithoutDividingByZero) {
  const auto r = simulate(make(ScheduleKind::one_f_one_b, 2, 2), CostModel::uniform(2, 0, 0, 0, 0));
  EXPECT_DOUBLE_EQ(r.makespan, 0);
  EXPECT_DOUBLE_EQ(r.bubble_overall, 0);
  EXPECT_FALSE(std::isnan(r.bubble[0]));
}

}  // namespace
}  // namespace pipetrain::schedule
