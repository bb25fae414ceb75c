// The exact min-max partitioner: the contiguous split of per-layer costs into stages that
// minimises the most expensive stage.
#pragma once

#include <cstdint>
#include <vector>

namespace pipetrain {

struct MinMaxOptions {
  // Fixed cost added to the first / last stage (an embedding, the loss, or the first stage's
  // extra in-flight activations under 1F1B), so the split leaves those stages lighter.
  double extra_first = 0.0;
  double extra_last = 0.0;
};

// The balance (layers per stage, each >= 1, summing to costs.size()) whose most expensive
// stage is as cheap as possible. Exact (dynamic programming, O(parts x n^2)); among optimal
// splits it picks the one whose stages' costs are most even (smallest sum of squares), then the
// lexicographically smallest. Costs must be finite and >= 0. ConfigError when
// parts < 1 or parts > costs.size().
std::vector<int64_t> min_max_partition(const std::vector<double>& costs, int64_t parts,
                                       const MinMaxOptions& options = {});

// Each stage's cost under a balance (extras included).
std::vector<double> stage_costs(const std::vector<double>& costs, const std::vector<int64_t>& balance,
                                const MinMaxOptions& options = {});

// The cost of the most expensive stage under a balance.
double max_stage_cost(const std::vector<double>& costs, const std::vector<int64_t>& balance,
                      const MinMaxOptions& options = {});

// A simple greedy split (fill each stage up to the average), the baseline the exact
// partitioner is tested against.
std::vector<int64_t> greedy_partition(const std::vector<double>& costs, int64_t parts);

}  // namespace pipetrain
