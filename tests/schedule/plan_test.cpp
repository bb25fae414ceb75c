// The planner's search: a closed form for one stage, the memory cap, and its errors.
#include "pipetrain/schedule/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "pipetrain/error.h"

namespace pipetrain::schedule {
namespace {

// n identical layers: forward f, input gradient b, weight gradient w, each holding `act` bytes
// for its backward and `param` bytes of parameters; costs scale with rows (M micro-batches of
// rows / M each).
LayerCosts layers(int n, int M, double f = 1e-3, double b = 1e-3, double w = 1e-3, double act = 1e6,
                  double param = 1e6) {
  LayerCosts c;
  const double scale = 1.0 / M;
  for (int i = 0; i < n; ++i) {
    c.forward.push_back(f * scale);
    c.backward_input.push_back(b * scale);
    c.backward_weight.push_back(w * scale);
    c.optimizer.push_back(1e-4);
    c.activation_bytes.push_back(act * scale);
    c.output_bytes.push_back(act * scale);
    c.param_bytes.push_back(param);
  }
  c.input_bytes = act * scale;
  return c;
}

PlanSearchOptions options(int processes, int cores = 64) {
  PlanSearchOptions o;
  o.processes = processes;
  o.cores = cores;
  o.batch_rows = 64;
  for (int M : {1, 2, 4, 8}) o.costs[M] = layers(8, M);
  o.link.latency_s = 0;
  o.link.bytes_per_s = 1e12;
  o.link.allreduce_bytes_per_s = 1e12;
  o.step_overhead_s = 5e-4;
  return o;
}

TEST(PlanSearch, TrainingKindsAreEveryGeneratedKindThatTrains) {
  const auto kinds = training_kinds();
  for (ScheduleKind k : {ScheduleKind::fill_drain, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                         ScheduleKind::zb_h1, ScheduleKind::zb_v})
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), k), kinds.end()) << kind_name(k);
  EXPECT_EQ(std::find(kinds.begin(), kinds.end(), ScheduleKind::inference), kinds.end());
  EXPECT_EQ(std::find(kinds.begin(), kinds.end(), ScheduleKind::custom), kinds.end());
}

// One stage, one micro-batch: no pipeline, so the step is every layer's F + B + W, the
// optimizer and the overhead; memory is weights + gradients (+ state) and every activation.
TEST(PlanSearch, OneStageIsTheClosedForm) {
  auto o = options(1);
  o.optimizer_state_factor = 2;  // Adam
  const Plan p = evaluate_plan(o, ScheduleKind::one_f_one_b, 1, 1, 0, 0);
  EXPECT_NEAR(p.step_s, 8 * 3e-3 + 8 * 1e-4 + 5e-4, 1e-12);
  EXPECT_NEAR(p.samples_per_s, 64 / p.step_s, 1e-9);
  EXPECT_EQ(p.balance, (std::vector<int64_t>{8}));
  ASSERT_EQ(p.peak_memory_bytes.size(), 1u);
  EXPECT_DOUBLE_EQ(p.peak_memory_bytes[0], 8 * 1e6 * 4 + (1e6 + 8 * 1e6));
  // Checkpointing: one more forward per backward, memory = input + one recompute.
  const Plan c = evaluate_plan(o, ScheduleKind::one_f_one_b, 1, 1, 0, 1);
  EXPECT_NEAR(c.step_s, 8 * 4e-3 + 8 * 1e-4 + 5e-4, 1e-12);
  EXPECT_EQ(c.checkpoint, 8);
  EXPECT_DOUBLE_EQ(c.peak_memory_bytes[0], 8 * 1e6 * 4 + 1e6 + 8 * 1e6);
}

TEST(PlanSearch, ReplicasPayForTheirAllReduceAndOversubscriptionForTheCores) {
  auto o = options(2);
  o.link.allreduce_bytes_per_s = 1e9;
  const Plan dp = evaluate_plan(o, ScheduleKind::one_f_one_b, 1, 1, 0, 0);
  EXPECT_EQ(dp.replicas, 2);
  // 2 (R-1)/R x 8 MB of gradients at 1 GB/s = 8 ms on top of the one-stage step.
  EXPECT_NEAR(dp.step_s, 8 * 3e-3 + 8 * 1e-4 + 8e-3 + 5e-4, 1e-9);
  EXPECT_NEAR(dp.samples_per_s, 2 * 64 / dp.step_s, 1e-9);
  // Two ranks on one core: the step is at least both ranks' work.
  o.cores = 1;
  o.link.allreduce_bytes_per_s = 1e12;
  const Plan shared = evaluate_plan(o, ScheduleKind::one_f_one_b, 1, 1, 0, 0);
  EXPECT_NEAR(shared.step_s, 2 * (8 * 3e-3 + 8 * 1e-4) + 5e-4, 1e-9);
}

// Four ranks on two cores: the pipeline is replayed with the ranks sharing the cores, so the
// idle cores while it fills and drains cost time the bound "work over the cores" never saw.
TEST(PlanSearch, MoreRanksThanCoresAreSimulatedSharingThem) {
  auto o = options(4, 2);
  const Plan p = evaluate_plan(o, ScheduleKind::one_f_one_b, 4, 2, 0, 0);
  const double work = 8 * 3e-3 + 8 * 1e-4;  // every rank's compute and updates
  EXPECT_GT(p.step_s, 1.1 * work / 2);
  // Replayed on a core each, the same plan is faster: the cores are the difference.
  o.cores = 4;
  EXPECT_LT(evaluate_plan(o, ScheduleKind::one_f_one_b, 4, 2, 0, 0).step_s, p.step_s);
  // Switching between ranks costs only where they outnumber the cores.
  o.shared_efficiency = 0.5;
  const double dedicated = evaluate_plan(o, ScheduleKind::one_f_one_b, 4, 2, 0, 0).step_s;
  o.shared_efficiency = 1;
  EXPECT_DOUBLE_EQ(dedicated, evaluate_plan(o, ScheduleKind::one_f_one_b, 4, 2, 0, 0).step_s);
  o.cores = 2;
  o.shared_efficiency = 0.5;
  EXPECT_GT(evaluate_plan(o, ScheduleKind::one_f_one_b, 4, 2, 0, 0).step_s, p.step_s * 1.1);
}

// An optimizer step streams its stage's parameters, gradients and state through memory: with a
// bandwidth given, a stage pays at least those bytes over it, and the profiled (in-cache) steps
// where they are slower.
TEST(PlanSearch, TheOptimizerStepPaysForTheBytesItStreams) {
  auto o = options(1);
  const Plan cached = evaluate_plan(o, ScheduleKind::one_f_one_b, 1, 1, 0, 0);
  o.optimizer_state_factor = 1;  // momentum
  o.stream_bytes_per_s = 1e9;
  const Plan streamed = evaluate_plan(o, ScheduleKind::one_f_one_b, 1, 1, 0, 0);
  // 8 layers x 1 MB x (4 + 2) at 1 GB/s = 48 ms in place of 8 x 0.1 ms.
  EXPECT_NEAR(streamed.step_s - cached.step_s, 48e-3 - 8e-4, 1e-9);
  o.stream_bytes_per_s = 1e12;  // fast memory: the profiled steps are the bound
  EXPECT_NEAR(evaluate_plan(o, ScheduleKind::one_f_one_b, 1, 1, 0, 0).step_s, cached.step_s, 1e-12);
  // Two stages: each streams only its own half.
  auto two = options(2);
  two.stream_bytes_per_s = 1e9;
  const Plan p = evaluate_plan(two, ScheduleKind::one_f_one_b, 2, 1, 0, 0);
  two.stream_bytes_per_s = 0;
  const Plan q = evaluate_plan(two, ScheduleKind::one_f_one_b, 2, 1, 0, 0);
  EXPECT_NEAR(p.step_s - q.step_s, 4 * 4e-3 - 4 * 1e-4, 1e-9);
}

TEST(PlanSearch, BestFirstAndEveryPlanValid) {
  const auto plans = search_plans(options(2));
  ASSERT_GT(plans.size(), 10u);
  for (size_t i = 1; i < plans.size(); ++i) EXPECT_GE(plans[i - 1].samples_per_s, plans[i].samples_per_s);
  for (const Plan& p : plans) {
    EXPECT_EQ(p.stages * p.replicas, 2);
    EXPECT_EQ(static_cast<int>(p.balance.size()), p.stages * p.chunks);
    int64_t sum = 0;
    for (auto b : p.balance) sum += b;
    EXPECT_EQ(sum, 8);
  }
}

// One stage runs 1F1B only (another order has no bubble to fill and only defers the weight
// gradients), unless the caller asked for other kinds.
TEST(PlanSearch, OneStagePlansAreOneFOneBUnlessAskedOtherwise) {
  const auto plans = search_plans(options(2));
  int one_stage = 0;
  for (const Plan& p : plans) {
    if (p.stages != 1) continue;
    ++one_stage;
    EXPECT_EQ(p.kind, ScheduleKind::one_f_one_b) << kind_name(p.kind);
  }
  EXPECT_EQ(one_stage, 8);  // M = 1, 2, 4, 8, with and without checkpointing
  auto asked = options(2);
  asked.kinds = {ScheduleKind::zb_h1};
  asked.stage_counts = {1};
  const auto zb = search_plans(asked);
  ASSERT_FALSE(zb.empty());
  for (const Plan& p : zb) EXPECT_EQ(p.kind, ScheduleKind::zb_h1);
}

// A cap just under the fastest plan's peak excludes it: another plan, within the cap, wins.
TEST(PlanSearch, AMemoryCapThatExcludesTheFastestPlanPicksAnother) {
  auto o = options(2);
  const auto free = search_plans(o);
  const Plan fastest = free.front();
  o.max_memory_bytes = fastest.max_peak_memory_bytes() - 1;
  const auto capped = search_plans(o);
  ASSERT_FALSE(capped.empty());
  for (const Plan& p : capped) EXPECT_LE(p.max_peak_memory_bytes(), o.max_memory_bytes);
  EXPECT_LE(capped.front().samples_per_s, fastest.samples_per_s);
}

TEST(PlanSearch, AnImpossibleCapNamesTheCapAndTheLeastNeeded) {
  auto o = options(2);
  double least = 1e300;
  for (const Plan& p : search_plans(o)) least = std::min(least, p.max_peak_memory_bytes());
  o.max_memory_bytes = 1 << 20;  // 1 MiB: less than the weights
  try {
    search_plans(o);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--max-memory-mb 1.0"), std::string::npos) << what;
    char need[32];
    std::snprintf(need, sizeof need, "%.1f MiB", least / (1 << 20));
    EXPECT_NE(what.find(need), std::string::npos) << what << " should name " << need;
  }
}

TEST(PlanSearch, MissingCostsAndBadProcessCountsAreConfigErrors) {
  auto o = options(2);
  EXPECT_THROW(evaluate_plan(o, ScheduleKind::one_f_one_b, 2, 16, 0, 0), ConfigError);
  EXPECT_THROW(evaluate_plan(o, ScheduleKind::one_f_one_b, 3, 4, 0, 0), ConfigError);
  o.costs.clear();
  EXPECT_THROW(search_plans(o), ConfigError);
}

}  // namespace
}  // namespace pipetrain::schedule
