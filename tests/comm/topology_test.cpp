// The process grid: coordinates, neighbours and the rank sets of every group.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "pipetrain/comm/topology.h"
#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace {

TEST(Topology, CoordinatesNeighboursAndNames) {
  {  // PipeIsOutermost
    const Topology t(3, 2);
    EXPECT_EQ(t.world_size(), 6);
    // rank = stage * replicas + replica, as DeepSpeed's PipeDataParallelTopology.
    const int table[3][2] = {{0, 1}, {2, 3}, {4, 5}};
    for (int s = 0; s < 3; ++s) {
      for (int d = 0; d < 2; ++d) {
        EXPECT_EQ(t.rank_of(s, d), table[s][d]);
        EXPECT_EQ(t.coord_of(table[s][d]), (Coord{s, d}));
      }
    }
    EXPECT_TRUE(t.is_first_stage(1));
    EXPECT_TRUE(t.is_last_stage(4));
    EXPECT_FALSE(t.is_last_stage(3));
  }
  {  // Neighbours
    const Topology t(3, 2);
    EXPECT_EQ(t.prev_rank(0), std::nullopt);
    EXPECT_EQ(t.next_rank(0), 2);
    EXPECT_EQ(t.next_rank(3), 5);
    EXPECT_EQ(t.prev_rank(5), 3);
    EXPECT_EQ(t.next_rank(5), std::nullopt);
    EXPECT_EQ(t.pipe_neighbor(5, 1), 1);   // last stage wraps to the first, same replica
    EXPECT_EQ(t.pipe_neighbor(0, -1), 4);
  }
  {  // GroupRanks
    const Topology t(3, 2);
    EXPECT_EQ(t.data_parallel_ranks(1), (std::vector<int>{2, 3}));
    EXPECT_EQ(t.pipeline_ranks(1), (std::vector<int>{1, 3, 5}));
    EXPECT_EQ(t.tied_ranks({2, 0}, 1), (std::vector<int>{1, 5}));
  }
  {  // DescribeRank
    EXPECT_EQ(Topology(2, 1).describe_rank(1), "stage 1 (rank 1)");
    EXPECT_EQ(Topology(2, 2).describe_rank(3), "stage 1, replica 1 (rank 3)");
    EXPECT_EQ(Topology(2, 2).describe(), "2 stages x 2 replicas");
  }
}

TEST(Topology, TensorAxisIsInnermostAsDeepSpeedsPipeModelDataTopology) {
  // 2 stages x 2 replicas x 2 tensor-parallel: rank = (stage * 2 + replica) * 2 + tensor.
  const Topology t(2, 2, 2);
  EXPECT_EQ(t.world_size(), 8);
  EXPECT_EQ(t.rank_of(1, 0, 1), 5);
  EXPECT_EQ(t.coord_of(6), (Coord{1, 1, 0}));
  EXPECT_EQ(t.tensor_parallel_ranks(1, 1), (std::vector<int>{6, 7}));
  EXPECT_EQ(t.data_parallel_ranks(0, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(t.pipeline_ranks(1, 1), (std::vector<int>{3, 7}));
  EXPECT_EQ(t.next_rank(3), 7);  // same replica and tensor index, next stage
  EXPECT_EQ(t.prev_rank(5), 1);
  EXPECT_EQ(t.tied_ranks({0, 1}, 0, 1), (std::vector<int>{1, 5}));
  EXPECT_EQ(t.describe_rank(5), "stage 1, replica 0, tensor 1 (rank 5)");
  EXPECT_EQ(t.describe(), "2 stages x 2 replicas x 2 tensor-parallel");
  // Every rank is in exactly one group of each kind.
  std::map<std::string, std::vector<int>> member_of;
  for (const auto& g : t.groups({{"embed", {0, 1}}})) {
    const auto kind = g.name.substr(0, g.name.find('/'));
    for (int r : g.ranks) member_of[kind].push_back(r);
  }
  for (const auto& kind : {"dp", "pipe", "tp", "tied"}) {
    auto ranks = member_of[kind];
    std::sort(ranks.begin(), ranks.end());
    EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7})) << kind;
  }
  // Without tensor parallelism the names and ranks are those of the two-axis grid.
  EXPECT_EQ(Topology(2, 2, 1).groups().size(), 4u);
  EXPECT_EQ(Topology::for_world(8, 2, 0, 2).replicas(), 2);
  try {
    Topology::for_world(6, 2, 0, 2);
    FAIL() << "6 ranks accepted for 2 stages x 2 tensor-parallel";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not a multiple of the 2 stages x 2 tensor-parallel = 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Topology(2, 1, 0), ConfigError);
}

TEST(Topology, GroupsInCanonicalOrder) {
  const Topology t(2, 2);
  const auto groups = t.groups({{"embed", {0, 1}}});
  std::vector<std::string> names;
  for (const auto& g : groups) names.push_back(g.name);
  EXPECT_EQ(names, (std::vector<std::string>{"dp/stage0", "dp/stage1", "pipe/replica0", "pipe/replica1",
                                             "tied/embed/replica0", "tied/embed/replica1"}));
  EXPECT_EQ(groups[4].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(groups[5].ranks, (std::vector<int>{1, 3}));
  EXPECT_TRUE(groups[5].contains(3));
  EXPECT_FALSE(groups[5].contains(2));
}

TEST(Topology, Errors) {
  EXPECT_THROW(Topology(0, 1), ConfigError);
  EXPECT_THROW(Topology(2, 0), ConfigError);
  try {
    Topology::for_world(3, 2, 2);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "world size 3 != 2 stages x 2 replicas = 4; launch 4 processes (pipetrain launch "
                 "--nproc 4 ...) or change the number of stages or replicas");
  }
  EXPECT_THROW(Topology::for_world(5, 2), ConfigError);
  EXPECT_EQ(Topology::for_world(6, 2).replicas(), 3);
  const Topology t(2, 1);
  EXPECT_THROW(t.coord_of(2), ConfigError);
  EXPECT_THROW(t.rank_of(2, 0), ConfigError);
  EXPECT_THROW(t.groups({{"w", {0, 2}}}), ConfigError);
  EXPECT_THROW(t.groups({{"w", {0}}, {"w", {1}}}), ConfigError);
  EXPECT_THROW(t.groups({{"", {0}}}), ConfigError);
}

}  // namespace
}  // namespace pipetrain::comm
