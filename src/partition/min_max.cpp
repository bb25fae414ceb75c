// The exact min-max partitioner over per-layer costs.
#include "pipetrain/partition/min_max.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_inputs(const std::vector<double>& costs, int64_t parts) {
  const auto n = static_cast<int64_t>(costs.size());
  if (parts < 1 || parts > n) {
    throw ConfigError("cannot split " + std::to_string(n) + " layers into " + std::to_string(parts) +
                      " stages: every stage needs at least one layer; use between 1 and " +
                      std::to_string(n) + " stages");
  }
  for (size_t i = 0; i < costs.size(); ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      throw ConfigError("layer " + std::to_string(i) + " has cost " + std::to_string(costs[i]) +
                        "; per-layer costs must be finite and >= 0");
    }
  }
}

// Relative tolerance for comparing float sums computed in different orders.
bool nearly_equal(double a, double b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 1e-9 * std::max({1.0, std::fabs(a), std::fabs(b)});
}

}  // namespace

std::vector<int64_t> min_max_partition(const std::vector<double>& costs, int64_t parts,
                                       const MinMaxOptions& options) {
  check_inputs(costs, parts);
  const auto n = static_cast<int64_t>(costs.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  auto extra = [&](int64_t stage) {
    double e = 0.0;
    if (stage == 0) e += options.extra_first;
    if (stage == parts - 1) e += options.extra_last;
    return e;
  };

  // best[j][i]: (max stage cost, sum of squares) of the first i layers split into j stages,
  // where stage j-1 is stage index j-1 of the final pipeline. cut[j][i]: where stage j-1 starts.
  struct Value {
    double max = kInf;
    double squares = kInf;
  };
  auto better = [](const Value& a, const Value& b) {
    if (!nearly_equal(a.max, b.max)) return a.max < b.max;
    if (!nearly_equal(a.squares, b.squares)) return a.squares < b.squares;
    return false;
  };
  std::vector<std::vector<Value>> best(parts + 1, std::vector<Value>(n + 1));
  std::vector<std::vector<int64_t>> cut(parts + 1, std::vector<int64_t>(n + 1, -1));
  best[0][0] = {0.0, 0.0};
  for (int64_t j = 1; j <= parts; ++j) {
    // Stage j-1 ends at layer i (exclusive); it needs >= 1 layer and leaves >= 1 per later stage.
    for (int64_t i = j; i <= n - (parts - j); ++i) {
      for (int64_t k = j - 1; k < i; ++k) {
        const Value& prev = best[j - 1][k];
        if (prev.max == kInf) continue;
        const double stage = prefix[i] - prefix[k] + extra(j - 1);
        const Value candidate{std::max(prev.max, stage), prev.squares + stage * stage};
        if (better(candidate, best[j][i])) {
          best[j][i] = candidate;
          cut[j][i] = k;
        }
      }
    }
  }
  std::vector<int64_t> balance(parts);
  int64_t end = n;
  for (int64_t j = parts; j >= 1; --j) {
    const int64_t begin = cut[j][end];
    balance[j - 1] = end - begin;
    end = begin;
  }
  return balance;
}

std::vector<double> stage_costs(const std::vector<double>& costs, const std::vector<int64_t>& balance,
                                const MinMaxOptions& options) {
  const int64_t total = std::accumulate(balance.begin(), balance.end(), int64_t{0});
  if (total != static_cast<int64_t>(costs.size())) {
    throw BalanceError("balance sums to " + std::to_string(total) + " but there are " +
                       std::to_string(costs.size()) + " layers");
  }
  std::vector<double> out(balance.size(), 0.0);
  size_t layer = 0;
  for (size_t j = 0; j < balance.size(); ++j) {
    for (int64_t i = 0; i < balance[j]; ++i) out[j] += costs[layer++];
  }
  if (!out.empty()) {
    out.front() += options.extra_first;
    out.back() += options.extra_last;
  }
  return out;
}

double max_stage_cost(const std::vector<double>& costs, const std::vector<int64_t>& balance,
                      const MinMaxOptions& options) {
  const auto per_stage = stage_costs(costs, balance, options);
  return per_stage.empty() ? 0.0 : *std::max_element(per_stage.begin(), per_stage.end());
}

std::vector<int64_t> greedy_partition(const std::vector<double>& costs, int64_t parts) {
  check_inputs(costs, parts);
  const auto n = static_cast<int64_t>(costs.size());
  const double target = std::accumulate(costs.begin(), costs.end(), 0.0) / static_cast<double>(parts);
  std::vector<int64_t> balance;
  int64_t i = 0;
  for (int64_t j = 0; j < parts; ++j) {
    const int64_t stages_left = parts - j - 1;
    int64_t count = 1;
    double sum = costs[i];
    while (i + count < n - stages_left && (j == parts - 1 || sum + costs[i + count] <= target)) {
      sum += costs[i + count];
      ++count;
    }
    balance.push_back(count);
    i += count;
  }
  return balance;
}

}  // namespace pipetrain
