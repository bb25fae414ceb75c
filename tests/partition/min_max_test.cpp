// The min-max partitioner against brute force and against a greedy split.
#include "pipetrain/partition/min_max.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

// Every contiguous split into `parts` non-empty stages, by recursion over the first cut.
double brute_force_best(const std::vector<double>& costs, int64_t parts, const MinMaxOptions& options) {
  const auto n = static_cast<int64_t>(costs.size());
  double best = 1e300;
  std::vector<int64_t> balance;
  std::function<void(int64_t, int64_t)> go = [&](int64_t start, int64_t left) {
    if (left == 1) {
      balance.push_back(n - start);
      best = std::min(best, max_stage_cost(costs, balance, options));
      balance.pop_back();
      return;
    }
    for (int64_t len = 1; start + len <= n - (left - 1); ++len) {
      balance.push_back(len);
      go(start + len, left - 1);
      balance.pop_back();
    }
  };
  go(0, parts);
  return best;
}

TEST(MinMax, SmallCasesByHand) {
  EXPECT_EQ(min_max_partition({1, 1, 1, 1}, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(min_max_partition({1, 1, 1, 10, 1, 1, 1, 1}, 3), (std::vector<int64_t>{3, 1, 4}));
  EXPECT_EQ(min_max_partition({5}, 1), (std::vector<int64_t>{1}));
  // An extra cost on the first stage pushes layers to the later ones.
  EXPECT_EQ(min_max_partition({1, 1, 1, 1, 1, 1}, 2, {/*extra_first=*/2.0, 0.0}),
            (std::vector<int64_t>{2, 4}));
}

TEST(MinMax, RejectsImpossibleSplits) {
  EXPECT_THROW(min_max_partition({1, 2}, 3), ConfigError);
  EXPECT_THROW(min_max_partition({1, 2}, 0), ConfigError);
  try {
    min_max_partition({1, -2}, 1);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
}

RC_GTEST_PROP(MinMax, EqualsBruteForceAndBeatsGreedy, ()) {
  const auto n = *rc::gen::inRange<int64_t>(1, 11);
  const auto costs_int = *rc::gen::container<std::vector<int>>(n, rc::gen::inRange(0, 20));
  const std::vector<double> costs(costs_int.begin(), costs_int.end());
  const auto parts = *rc::gen::inRange<int64_t>(1, n + 1);
  const MinMaxOptions options{static_cast<double>(*rc::gen::inRange(0, 5)),
                              static_cast<double>(*rc::gen::inRange(0, 5))};
  const auto balance = min_max_partition(costs, parts, options);
  RC_ASSERT(static_cast<int64_t>(balance.size()) == parts);
  RC_ASSERT(std::accumulate(balance.begin(), balance.end(), int64_t{0}) == n);
  RC_ASSERT(std::all_of(balance.begin(), balance.end(), [](int64_t b) { return b >= 1; }));
  RC_ASSERT(max_stage_cost(costs, balance, options) == brute_force_best(costs, parts, options));
  const auto greedy = greedy_partition(costs, parts);
  RC_ASSERT(max_stage_cost(costs, balance, options) <= max_stage_cost(costs, greedy, options));
}

}  // namespace
}  // namespace pipetrain
