// The simulator with fewer cores than stages (CostModel::cores): the shared replay against the
// dedicated one, against what cores can do at most, and against a hand-computed timeline.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "pipetrain/error.h"
#include "pipetrain/schedule/defer_weights.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/simulate.h"

namespace pipetrain::schedule {
namespace {

const std::vector<ScheduleKind> kReplayKinds{ScheduleKind::fill_drain, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                       ScheduleKind::zb_h1,      ScheduleKind::zb_v,        ScheduleKind::dualpipe_v,
                                       ScheduleKind::v_half,     ScheduleKind::v_min};

// Uneven costs, sends and transfers: waits of every kind.
CostModel uneven(int P) {
  CostModel c = CostModel::uniform(P, 1, 1.25, 0.75, 0.1);
  c.forward[static_cast<size_t>(P - 1)] = 1.5;
  c.backward_input[0] = 0.9;
  c.send.assign(static_cast<size_t>(P), 0.05);
  return c;
}

// Fill runs longer than rounding (the dedicated replay keeps runs of a few ulps).
std::vector<TimedEvent> real_runs(const std::vector<TimedEvent>& fills) {
  std::vector<TimedEvent> out;
  for (const TimedEvent& f : fills)
    if (f.end - f.start > 1e-9) out.push_back(f);
  return out;
}

double total_work(const SimulationResult& dedicated) {
  double w = 0;
  for (double b : dedicated.busy) w += b;
  return w;
}

TEST(SharedCores, ACoreForEveryStageGivesTheDedicatedTimings) {
  for (ScheduleKind kind : kReplayKinds) {
    for (auto [P, M] : {std::pair{2, 4}, {4, 8}, {3, 6}}) {
      for (bool fill : {false, true}) {
        SCOPED_TRACE(std::string(kind_name(kind)) + " P=" + std::to_string(P) + " M=" + std::to_string(M) +
                     (fill ? " fill" : ""));
        Schedule s;
        try {
          s = defer_weight_gradients(generate(ScheduleOptions(kind, P, M)));
        } catch (const ScheduleError&) {
          continue;  // a kind that takes other counts
        }
        CostModel costs = uneven(P);
        costs.fill_waits = fill;
        const SimulationResult dedicated = simulate(s, costs);
        for (double cores : {static_cast<double>(P), P + 1.5}) {
          costs.cores = cores;
          const SimulationResult shared = simulate(s, costs);
          EXPECT_NEAR(shared.makespan, dedicated.makespan, 1e-9);
          for (int j = 0; j < P; ++j) {
            ASSERT_EQ(shared.timeline[j].size(), dedicated.timeline[j].size());
            for (size_t k = 0; k < shared.timeline[j].size(); ++k) {
              EXPECT_NEAR(shared.timeline[j][k].start, dedicated.timeline[j][k].start, 1e-9) << j << "/" << k;
              EXPECT_NEAR(shared.timeline[j][k].end, dedicated.timeline[j][k].end, 1e-9) << j << "/" << k;
            }
            const auto a = real_runs(shared.fills[j]), b = real_runs(dedicated.fills[j]);
            ASSERT_EQ(a.size(), b.size()) << "stage " << j;
            for (size_t i = 0; i < a.size(); ++i) {
              EXPECT_NEAR(a[i].start, b[i].start, 1e-9);
              EXPECT_NEAR(a[i].end, b[i].end, 1e-9);
            }
          }
        }
      }
    }
  }
}

TEST(SharedCores, OneCoreRunsAllTheWorkBackToBack) {
  // Free transfers and sends: whenever one rank waits, another can run, so one core never idles.
  for (ScheduleKind kind : kReplayKinds) {
    for (bool fill : {false, true}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + (fill ? " fill" : ""));
      const Schedule s = defer_weight_gradients(generate(ScheduleOptions(kind, 4, 8)));
      CostModel costs = CostModel::uniform(4, 1, 1.25, 0.75, 0);
      costs.forward[3] = 1.5;
      costs.fill_waits = fill;
      const double work = total_work(simulate(s, costs));
      costs.cores = 1;
      EXPECT_NEAR(simulate(s, costs).makespan, work, 1e-9);
    }
  }
}

TEST(SharedCores, FewerCoresCostAtLeastTheirShareAndAtMostTheirRatio) {
  for (ScheduleKind kind : kReplayKinds) {
    for (double cores : {1.0, 1.5, 2.0, 3.0}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + " cores " + std::to_string(cores));
      const Schedule s = defer_weight_gradients(generate(ScheduleOptions(kind, 4, 8)));
      CostModel costs = uneven(4);
      const SimulationResult dedicated = simulate(s, costs);
      costs.cores = cores;
      const SimulationResult shared = simulate(s, costs);
      // No rank runs faster than alone, and the cores do at most `cores` of work at once ...
      EXPECT_GE(shared.makespan, dedicated.makespan - 1e-9);
      EXPECT_GE(shared.makespan, total_work(dedicated) / cores - 1e-9);
      // ... and every rank gets at least cores / 4 of its speed.
      EXPECT_LE(shared.makespan, dedicated.makespan * 4 / cores + 1e-9);
    }
  }
}

TEST(SharedCores, FourRanksOnTwoCoresIdleWhileThePipelineFillsAndDrains) {
  // 1F1B, 4 stages, 2 micro-batches, F = 1 and a full backward of 2 on every stage, 2 cores.
  // Work 24, so the bound "work over the cores" says 12; the pipeline takes 15, as long as on
  // a core each. By hand: [0,1] only stage 0 (F0) can
  // run; [1,4] two at a time (0F1 1F0, 1F1 2F0, 2F1 3F0); [4,6] 3B0 alone; then 3F1 and 2B0 share,
  // and the backwards drain down the stages with at most two ranks able to run until 0B1 runs
  // alone over [13,15].
  const Schedule s = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 4, 2));
  CostModel costs = CostModel::uniform(4, 1, 2, 0, 0);
  costs.cores = 2;
  const SimulationResult r = simulate(s, costs);
  EXPECT_DOUBLE_EQ(r.makespan, 15);
  const auto& stage3 = r.timeline[3];
  double b0_end = -1;
  for (const auto& t : stage3)
    if (is_backward(t.action.op) && t.action.micro_batch == 0) b0_end = t.end;
  EXPECT_DOUBLE_EQ(b0_end, 6);
}

TEST(SharedCores, SwitchingCostsOnlyWhileTheRanksOutnumberTheCores) {
  // Fill-drain, 2 stages, 2 micro-batches, F = B = 1, one core. [0,1] 0F0 alone; then 0F1 and
  // 1F0 together; 1F1 and 1B0 alone; then 1B1 and 0B0 together; 0B1 alone. At full efficiency
  // that is all 8 units of work back to back; at half, each of the two shared stretches of 2
  // units of work takes 4 instead of 2.
  const Schedule s = generate(ScheduleOptions(ScheduleKind::fill_drain, 2, 2));
  CostModel costs = CostModel::uniform(2, 1, 1, 0, 0);
  costs.cores = 1;
  EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, 8);
  costs.shared_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, 12);
  // Four ranks on two cores that never have more than two ranks with work: no cost at all.
  CostModel four = CostModel::uniform(4, 1, 2, 0, 0);
  four.cores = 2;
  four.shared_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(simulate(generate(ScheduleOptions(ScheduleKind::one_f_one_b, 4, 2)), four).makespan, 15);
}

TEST(SharedCores, MessagesCostTheirRanksWorkOnSharedCoresOnly) {
  // Fill-drain, 2 stages, 1 micro-batch, F = B = 1, one core: 0F0, its activation, 1F0 1B0, the
  // gradient, 0B0, all in turn. Each of the two messages costs 1 of work, half on each side.
  const Schedule s = generate(ScheduleOptions(ScheduleKind::fill_drain, 2, 1));
  CostModel costs = CostModel::uniform(2, 1, 1, 0, 0);
  costs.message_work = 1;
  EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, 4);  // a core each: the work hides in the waits
  costs.cores = 1;
  const SimulationResult r = simulate(s, costs);
  EXPECT_DOUBLE_EQ(r.makespan, 6);
  // The receiver takes its half after the message is there: 1F0 starts at 1 + 0.5 + 0.5.
  for (const auto& t : r.timeline[1]) {
    if (t.action.op == Op::forward) {
      EXPECT_DOUBLE_EQ(t.start, 2);
    }
  }
  costs.cores = 2;  // as many cores as stages: no sharing, so no cost either
  EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, 4);
}

TEST(SharedCores, RejectsBadCoreCountsAndEfficiencies) {
  const Schedule s = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 2));
  CostModel costs = CostModel::uniform(2, 1, 1, 1, 0);
  costs.cores = -1;
  EXPECT_THROW(simulate(s, costs), ConfigError);
  costs.cores = 1;
  for (double bad : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    costs.shared_efficiency = bad;
    EXPECT_THROW(simulate(s, costs), ConfigError) << bad;
  }
  costs.shared_efficiency = 1;
  costs.message_work = -1;
  EXPECT_THROW(simulate(s, costs), ConfigError);
}

}  // namespace
}  // namespace pipetrain::schedule
