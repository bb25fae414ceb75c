// The fill-drain clock, as a table.
#include "pipetrain/runtime/clock.h"

#include <gtest/gtest.h>

namespace pipetrain::runtime {
namespace {

TEST(ClockCycles, FourMicroBatchesThreePartitions) {
  const std::vector<Tick> expected = {
      {{0, 0}},
      {{1, 0}, {0, 1}},
      {{2, 0}, {1, 1}, {0, 2}},
      {{3, 0}, {2, 1}, {1, 2}},
      {{3, 1}, {2, 2}},
      {{3, 2}},
  };
  EXPECT_EQ(clock_cycles(4, 3), expected);
}

TEST(ClockCycles, EveryTaskOnceAtTickIPlusJ) {
  for (int64_t m = 1; m <= 6; ++m) {
    for (int64_t n = 1; n <= 5; ++n) {
      const auto ticks = clock_cycles(m, n);
      ASSERT_EQ(static_cast<int64_t>(ticks.size()), m + n - 1);
      int64_t tasks = 0;
      for (size_t k = 0; k < ticks.size(); ++k) {
        for (const auto& [i, j] : ticks[k]) {
          EXPECT_EQ(static_cast<size_t>(i + j), k);
          ++tasks;
        }
      }
      EXPECT_EQ(tasks, m * n);
    }
  }
  EXPECT_TRUE(clock_cycles(0, 3).empty());
  EXPECT_TRUE(clock_cycles(3, 0).empty());
}

}  // namespace
}  // namespace pipetrain::runtime
