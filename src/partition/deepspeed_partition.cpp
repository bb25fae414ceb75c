// DeepSpeed's partitioners, reproduced exactly (see deepspeed_partition.h).
#include "pipetrain/partition/deepspeed_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

void check_deepspeed_parts(int64_t items, int64_t parts) {
  if (parts < 1) throw ConfigError("a pipeline needs at least one stage, got " + std::to_string(parts));
  if (items < parts) {
    throw BalanceError("the model has " + std::to_string(items) + " layers, fewer than the " + std::to_string(parts) +
                       " stages; DeepSpeed would leave stages empty, pipetrain needs a layer on each: use fewer "
                       "stages or more layers");
  }
}

}  // namespace

std::vector<int64_t> deepspeed_partition_uniform(int64_t items, int64_t parts) {
  check_deepspeed_parts(items, parts);
  std::vector<int64_t> balance(static_cast<size_t>(parts), items / parts);
  for (int64_t p = 0; p < items % parts; ++p) ++balance[static_cast<size_t>(p)];
  return balance;
}

std::vector<int64_t> deepspeed_partition_balanced(const std::vector<double>& weights, int64_t parts) {
  const auto n = static_cast<int64_t>(weights.size());
  check_deepspeed_parts(n, parts);
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0) {
      throw ConfigError("layer " + std::to_string(i) + " has weight " + std::to_string(weights[i]) +
                        "; partition weights must be finite and >= 0");
    }
  }
  if (n == parts) return std::vector<int64_t>(static_cast<size_t>(parts), 1);
  const auto m = parts;
  const double inf = std::numeric_limits<double>::infinity();
  const auto cols = static_cast<size_t>(m + 1);
  auto at = [cols](int64_t i, int64_t j) { return static_cast<size_t>(i) * cols + static_cast<size_t>(j); };
  const size_t cells = static_cast<size_t>(n + 1) * cols;
  // For the first i layers in j stages: the heaviest and the lightest stage of the best split,
  // its cost (their difference) and where its last stage starts. The lightest of zero stages
  // stays infinite, as in DeepSpeed, so a first stage's cost is 0.
  std::vector<double> heaviest(cells, inf), lightest(cells, inf), cost(cells, inf);
  std::vector<int64_t> start(cells, 0);
  std::vector<double> prefix(static_cast<size_t>(n + 1), 0.0);
  for (size_t i = 0; i < weights.size(); ++i) prefix[i + 1] = prefix[i] + weights[i];
  heaviest[at(0, 0)] = 0;
  cost[at(0, 0)] = 0;
  for (int64_t i = 1; i <= n; ++i) {
    for (int64_t j = 1; j <= std::min(i, m); ++j) {
      for (int64_t k = 0; k < i; ++k) {
        const double last = prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(k)];
        const double hi = std::max(heaviest[at(k, j - 1)], last);
        const double lo = std::min(lightest[at(k, j - 1)], last);
        const double c = hi - lo;
        // `>=`: a later start of the last stage wins a tie (DeepSpeed's choice, kept).
        if (cost[at(i, j)] >= c) {
          cost[at(i, j)] = c;
          heaviest[at(i, j)] = hi;
          lightest[at(i, j)] = lo;
          start[at(i, j)] = k;
        }
      }
    }
  }
  std::vector<int64_t> balance(static_cast<size_t>(m));
  int64_t end = n;
  for (int64_t j = m; j >= 1; --j) {
    const int64_t begin = start[at(end, j)];
    balance[static_cast<size_t>(j - 1)] = end - begin;
    end = begin;
  }
  return balance;
}

}  // namespace pipetrain
