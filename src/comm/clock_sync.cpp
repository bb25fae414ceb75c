// Clock offsets between the members of a group (see the estimate in clock_sync.h).
#include "pipetrain/comm/clock_sync.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <functional>

#include "pipetrain/error.h"

namespace pipetrain::comm {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<double> estimate_clock_offsets(Group& group, int my_rank, const std::function<double()>& clock,
                                           int rounds) {
  if (rounds < 1) throw ConfigError("estimate_clock_offsets: rounds must be >= 1, got " + std::to_string(rounds));
  const int n = group.size();
  const int self = group.index_of(my_rank);
  auto readings = torch::zeros({rounds, n}, torch::kDouble);
  auto table = readings.accessor<double, 2>();
  std::vector<double> own(static_cast<size_t>(rounds));
  for (int k = 0; k < rounds; ++k) {
    group.barrier("clock offset estimate");
    own[static_cast<size_t>(k)] = clock();
  }
  for (int k = 0; k < rounds; ++k) table[k][self] = own[static_cast<size_t>(k)];
  // Readings are large (seconds since boot) and differences small: reduce in double, one
  // non-zero slot per column, so the sum is exact.
  std::vector<torch::Tensor> all{readings};
  group.all_reduce(all, ReduceOp::Sum, "clock readings");
  std::vector<double> offsets(static_cast<size_t>(n), 0.0);
  for (int i = 1; i < n; ++i) {
    std::vector<double> d;
    for (int k = 0; k < rounds; ++k) d.push_back(table[k][i] - table[k][0]);
    std::nth_element(d.begin(), d.begin() + rounds / 2, d.end());
    offsets[static_cast<size_t>(i)] = d[static_cast<size_t>(rounds / 2)];
  }
  return offsets;
}

bool all_on_one_host(Group& group) {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return false;
  // 48 bits of the name's hash: exact in a double, so equal max and min mean equal names.
  const double h = static_cast<double>(std::hash<std::string>{}(name) & ((uint64_t{1} << 48) - 1));
  const double hi = group.all_reduce_scalar(h, ReduceOp::Max, "host names");
  const double lo = group.all_reduce_scalar(h, ReduceOp::Min, "host names");
  return hi == lo;
}

}  // namespace pipetrain::comm
