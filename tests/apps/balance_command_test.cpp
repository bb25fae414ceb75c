// `pipetrain balance`: balances of the benchmark workload and the examples, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "apps/cli_runner.h"
#include "pipetrain/partition/min_max.h"

namespace pipetrain::apps {
namespace {

using ::testing::HasSubstr;
using testing::last_line;
using testing::run;

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

TEST(BalanceCommand, ParamsSplitsTheMlpWorkloadEvenly) {
  const auto r = run({"balance", "--workload", "mlp-4", "--by", "params"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 3: layers"));
  const auto j = nlohmann::json::parse(last_line(r.out));
  // Parameters live in the 16 Linears only, so each stage starts a Linear and holds 4 of them;
  // the ReLUs cost nothing and the partitioner's evenness tie-break leaves them in place.
  const auto balance = j["balance"].get<std::vector<int64_t>>();
  ASSERT_EQ(balance.size(), 4u);
  EXPECT_EQ(sum(balance), 32);
  for (double c : j["stage_costs"].get<std::vector<double>>()) EXPECT_EQ(c, 4 * (1024.0 * 1024 + 1024));
  EXPECT_EQ(j["unit"], "parameters");
}

TEST(BalanceCommand, TimeProfilesEveryLayerAndBalancesTheStages) {
  const auto r = run({"balance", "--workload", "mlp", "--budget-ms", "300", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(last_line(r.out));
  const auto costs = j["layer_costs"].get<std::vector<double>>();
  ASSERT_EQ(costs.size(), 32u);
  // A 32x1024x1024 Linear (forward + backward) costs far more than a ReLU on its output (about
  // 200 times). Compared by their medians: on a busy machine any one timing may include a turn
  // of another process, which can make one ReLU look like a Linear, but not half of them.
  std::vector<double> linears, relus;
  for (size_t i = 0; i < costs.size(); ++i) (i % 2 == 0 ? linears : relus).push_back(costs[i]);
  EXPECT_GT(median(linears), 5 * median(relus));
  // The balance is the exact min-max split of the costs it printed (whatever their noise), and
  // it splits the Linears between the stages.
  const auto balance = j["balance"].get<std::vector<int64_t>>();
  ASSERT_EQ(balance.size(), 2u);
  EXPECT_EQ(sum(balance), 32);
  EXPECT_EQ(balance, min_max_partition(costs, 2));
  EXPECT_GE(balance[0], 8);
  EXPECT_GE(balance[1], 8);
}

TEST(BalanceCommand, ExampleBySizeAndUniform) {
  auto r = run({"balance", "--example", "mlp", "--by", "size", "--stages", "3"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(last_line(r.out));
  EXPECT_EQ(j["unit"], "bytes");
  EXPECT_EQ(j["balance"].size(), 3u);
  r = run({"balance", "--example", "mlp", "--by", "uniform", "--stages", "2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(last_line(r.out));
  const auto balance = j["balance"].get<std::vector<int64_t>>();
  EXPECT_LE(std::abs(balance[0] - balance[1]), 1);
}

TEST(BalanceCommand, BadArgumentsAreErrorsThatSayWhatToDo) {
  auto r = run({"balance", "--by", "params"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("give exactly one of --workload"));
  r = run({"balance", "--workload", "mlp", "--by", "flops"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--by"));
  r = run({"balance", "--workload", "mlp", "--stages", "40", "--by", "params"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("--stages 40 exceeds the 32 layers"));
}

}  // namespace
}  // namespace pipetrain::apps
