// The fill-drain clock of GPipe.
#include "pipetrain/runtime/clock.h"

#include <algorithm>

namespace pipetrain::runtime {

std::vector<Tick> clock_cycles(int64_t m, int64_t n) {
  std::vector<Tick> ticks;
  if (m <= 0 || n <= 0) return ticks;
  for (int64_t k = 0; k < m + n - 1; ++k) {
    Tick tick;
    for (int64_t j = std::max<int64_t>(1 + k - m, 0); j < std::min<int64_t>(1 + k, n); ++j) {
      tick.emplace_back(k - j, j);
    }
    ticks.push_back(std::move(tick));
  }
  return ticks;
}

}  // namespace pipetrain::runtime
