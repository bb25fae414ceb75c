// The sharded sampler: disjoint equal shards that cover the epoch, reshuffled per epoch.
#include "apps/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "pipetrain/error.h"

namespace pipetrain::data {
namespace {

TEST(ShardedSampler, ShardsAreDisjointEqualAndCoverTheEpoch) {
  for (const int64_t n : {1, 7, 10, 64, 1001}) {
    for (const int64_t d : {1, 2, 3, 4}) {
      if (d > n) continue;
      for (const int64_t epoch : {0, 1, 5}) {
        std::set<int64_t> seen;
        for (int64_t r = 0; r < d; ++r) {
          const ShardedSampler sampler(n, d, r, 42);
          const auto shard = sampler.indices(epoch);
          ASSERT_EQ(static_cast<int64_t>(shard.size()), n / d);
          for (const int64_t i : shard) {
            ASSERT_TRUE(i >= 0 && i < n);
            ASSERT_TRUE(seen.insert(i).second) << "index " << i << " in two shards";
          }
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), d * (n / d)) << n << " " << d;
      }
    }
  }
}

TEST(ShardedSampler, SameInEveryProcessDifferentPerEpochAndSeed) {
  const auto a = ShardedSampler(1000, 2, 1, 7).indices(3);
  EXPECT_EQ(a, ShardedSampler(1000, 2, 1, 7).indices(3));
  EXPECT_NE(a, ShardedSampler(1000, 2, 1, 7).indices(4));
  EXPECT_NE(a, ShardedSampler(1000, 2, 1, 8).indices(3));
  // The permutation is a permutation, and not the identity.
  auto p = ShardedSampler::permutation(1000, 7, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(p, sorted);
}

TEST(ShardedSampler, LeftoversChangeFromEpochToEpoch) {
  // N = 10, D = 3: one sample is left over each epoch; over many epochs all get trained on.
  std::set<int64_t> left_over;
  for (int64_t epoch = 0; epoch < 50; ++epoch) {
    std::set<int64_t> used;
    for (int64_t r = 0; r < 3; ++r)
      for (const int64_t i : ShardedSampler(10, 3, r, 1).indices(epoch)) used.insert(i);
    for (int64_t i = 0; i < 10; ++i)
      if (!used.count(i)) left_over.insert(i);
  }
  EXPECT_GT(left_over.size(), 3u);
}

TEST(ShardedSampler, WithoutShuffleStridesInOrder) {
  EXPECT_EQ(ShardedSampler(10, 3, 1, 0, false).indices(0), (std::vector<int64_t>{1, 4, 7}));
}

TEST(ShardedSampler, RejectsBadArguments) {
  EXPECT_THROW(ShardedSampler(10, 0, 0, 1), ConfigError);
  EXPECT_THROW(ShardedSampler(10, 2, 2, 1), ConfigError);
  EXPECT_THROW(ShardedSampler(10, 2, -1, 1), ConfigError);
  EXPECT_THROW(ShardedSampler(3, 4, 0, 1), ConfigError);
  EXPECT_THROW(ShardedSampler(10, 2, 0, 1).indices(-1), ConfigError);
}

}  // namespace
}  // namespace pipetrain::data
