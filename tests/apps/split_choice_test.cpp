// choose_split, the default split of `pipetrain train`, as a table of costs in and the split,
// micro-batch count and summary line out (no profiling: the costs are given).
#include <gtest/gtest.h>

#include <string>

#include "apps/train/split_choice.h"
#include "pipetrain/error.h"

namespace pipetrain::apps::split_choice_test {
namespace {

// Layers whose forward at M micro-batches costs per_step[i] / M + fixed (seconds), the backward
// twice that; no bytes, a free link: the simulator sees compute only.
schedule::LayerCosts costs_at(const std::vector<double>& per_step, int m, double fixed) {
  schedule::LayerCosts c;
  for (double t : per_step) {
    c.forward.push_back(t / m + fixed);
    c.backward_input.push_back(2 * (t / m + fixed));
    c.backward_weight.push_back(0);
    c.optimizer.push_back(0);
    c.activation_bytes.push_back(0);
    c.output_bytes.push_back(0);
    c.param_bytes.push_back(0);
  }
  return c;
}

SplitRequest request(const std::vector<double>& per_step, std::vector<int> counts, double fixed,
                     double target = 0.10, int stages = 2) {
  SplitRequest r;
  r.search.processes = stages;
  r.search.cores = stages;
  r.search.batch_rows = 128;
  r.search.link = schedule::LinkModel{0, 1e12, 0, 1e12};
  r.search.defer_weights = false;
  for (int m : counts) r.search.costs[m] = costs_at(per_step, m, fixed);
  r.stages = stages;
  r.rows = 128;
  r.bubble_target = target;
  return r;
}

// Two halves of equal cost and layer count around two heavy layers (per step, seconds): every
// count's best split is 3|3 and balanced, so 1F1B's bubble is 1 / (M + 1) and a fixed cost per
// layer and micro-batch makes a step of M micro-batches take (M + 1) x 3 (0.020 / M + 3 fixed).
const std::vector<double> kHalves{0.004, 0.004, 0.012, 0.012, 0.004, 0.004};

struct Row {
  const char* what;
  std::vector<int> counts;
  double fixed;   // per layer and micro-batch (seconds)
  double target;  // bubble target
  std::vector<int64_t> balance;
  int micro_batches;
  bool within;
};

TEST(SplitChoice, TableOfCostsToSplitAndMicroBatches) {
  const std::vector<Row> rows{
      // Compute that divides evenly: more micro-batches only shrink the bubble, so the most wins.
      {"no fixed cost", {4, 8, 16}, 0.0, 0.10, {3, 3}, 16, true},
      // 1.2 ms fixed per stage and micro-batch: steps of 93, 100 and 125 ms, bubbles of 20, 11
      // and 6%: only 16 is within 10%.
      {"fixed cost, 10% target", {4, 8, 16}, 0.0004, 0.10, {3, 3}, 16, true},
      // Within 12% both 8 and 16 are: 8 predicts the faster step.
      {"fixed cost, 12% target", {4, 8, 16}, 0.0004, 0.12, {3, 3}, 8, true},
      // Within 30% all are: 4 predicts the fastest.
      {"fixed cost, 30% target", {4, 8, 16}, 0.0004, 0.30, {3, 3}, 4, true},
      // No count reaches a 0% bubble: the fastest of all, and the choice says so.
      {"unreachable target", {4, 8, 16}, 0.0004, 0.0, {3, 3}, 4, false},
      // Given micro-batches (one candidate, 20% > 10%): only the split is chosen.
      {"one count", {4}, 0.0, 0.10, {3, 3}, 4, false},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE(row.what);
    const auto c = choose_split(request(kHalves, row.counts, row.fixed, row.target));
    EXPECT_EQ(c.balance, row.balance);
    EXPECT_EQ(c.micro_batches, row.micro_batches);
    EXPECT_EQ(c.micro_batch_size, 128 / row.micro_batches);
    EXPECT_EQ(c.within_target, row.within) << c.line;
    EXPECT_NEAR(c.bubble, 1.0 / (row.micro_batches + 1), 1e-9);
    EXPECT_NEAR(c.step_s, (row.micro_batches + 1) * 3 * (0.020 / row.micro_batches + 3 * row.fixed), 1e-9);
  }
}

TEST(SplitChoice, BalancePutsTheHeavyLayerWhereTheStagesEvenOut) {
  // Per step: 1 + 1 + 6 | 2 + 2 + 2 + 2 (8 and 8) beats 1 + 1 | 6 + 8 and 1 + 1 + 6 + 2 | 6.
  const auto c = choose_split(request({0.001, 0.001, 0.006, 0.002, 0.002, 0.002, 0.002}, {8}, 0.0));
  EXPECT_EQ(c.balance, (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(c.stage_s.size(), 2u);
  // Forward + backward = 3x the forward per step.
  EXPECT_NEAR(c.stage_s[0], 3 * 0.008, 1e-12);
  EXPECT_NEAR(c.stage_s[1], 3 * 0.008, 1e-12);
  // Balanced stages under 1F1B: the bubble is (P - 1) / (M + P - 1) = 1 / 9.
  EXPECT_NEAR(c.bubble, 1.0 / 9.0, 1e-9);
}

TEST(SplitChoice, TheLineSaysWhichSplitAndWhy) {
  const auto c = choose_split(request({0.001, 0.001, 0.006, 0.002, 0.002, 0.002, 0.002}, {4, 8, 16}, 0.0));
  EXPECT_EQ(c.micro_batches, 16);
  EXPECT_EQ(c.line.rfind("split 3|4 by measured layer costs (stage times 24/24 ms), 16 micro-batches of 8: "
                         "simulated bubble 6%, the fastest predicted step (",
                         0),
            0u)
      << c.line;
  EXPECT_NE(c.line.find("of 3 micro-batch counts with bubble <= 10%"), std::string::npos) << c.line;

  auto far = request({0.001, 0.001, 0.006, 0.002, 0.002, 0.002, 0.002}, {4}, 0.0, 0.0);
  far.source = "measured layer times (balance-by-time)";
  const auto one = choose_split(far);
  EXPECT_NE(one.line.find("by measured layer times (balance-by-time)"), std::string::npos) << one.line;
  EXPECT_NE(one.line.find("predicted step"), std::string::npos) << one.line;
}

TEST(SplitChoice, FourStagesAndAnInterleavedLayout) {
  const std::vector<double> even(8, 0.002);
  const auto four = choose_split(request(even, {8}, 0.0, 0.10, 4));
  EXPECT_EQ(four.balance, (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(four.stage_s.size(), 4u);
  auto r = request(even, {8}, 0.0, 0.10, 2);
  r.kind = schedule::ScheduleKind::interleaved;
  r.chunks = 2;
  const auto interleaved = choose_split(r);
  EXPECT_EQ(interleaved.balance, (std::vector<int64_t>{2, 2, 2, 2}));  // 2 stages x 2 chunks
  ASSERT_EQ(interleaved.stage_s.size(), 2u);
  EXPECT_NEAR(interleaved.stage_s[0], interleaved.stage_s[1], 1e-12);
  EXPECT_EQ(interleaved.line.rfind("split 2|2|2|2 ", 0), 0u) << interleaved.line;
}

TEST(SplitChoice, NoCostsOrNoLayoutIsAConfigError) {
  SplitRequest empty;
  EXPECT_THROW(choose_split(empty), ConfigError);
  // Three layers cannot fill four stages.
  EXPECT_THROW(choose_split(request({0.001, 0.001, 0.001}, {4}, 0.0, 0.10, 4)), ConfigError);
}

TEST(SplitChoice, FormatBalance) {
  EXPECT_EQ(format_balance({5, 7}), "5|7");
  EXPECT_EQ(format_balance({12}), "12");
}

}  // namespace
}  // namespace pipetrain::apps::split_choice_test
