// Collectives between processes over Gloo: bucketed all-reduce, broadcast, barrier, scalars,
// and the groups of a 2 x 2 pipeline/data-parallel grid with tied weights.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "pipetrain/error.h"
#include "support/ranks.h"
#include "worker_util.h"

namespace pipetrain::comm {
namespace {

PIPETRAIN_RANK_WORKER(collectives_grid) {
  const RankInfo info = rank_info_from_env();
  const Topology topo = Topology::for_world(info.world_size, 2);
  CommOptions options = test::test_options(info.world_size);
  options.rank_namer([topo](int r) { return topo.describe_rank(r); }).bucket_bytes(256);
  auto comm = connect(info, options);
  const int rank = comm->rank();
  const float r = static_cast<float>(rank);

  // World: several buckets of 256 bytes, two dtypes, a transposed (non-contiguous) tensor.
  std::vector<torch::Tensor> grads{torch::full({100}, r), torch::full({7, 3}, 2.0 * rank, torch::kDouble),
                                   torch::full({8, 20}, r).t(), torch::full({5}, rank, torch::kLong)};
  comm->world().all_reduce(grads, ReduceOp::Sum, "gradients");
  EXPECT_TRUE(grads[0].equal(torch::full({100}, 6.0f)));
  EXPECT_TRUE(grads[1].equal(torch::full({7, 3}, 12.0, torch::kDouble)));
  EXPECT_TRUE(grads[2].equal(torch::full({20, 8}, 6.0f)));
  EXPECT_TRUE(grads[3].equal(torch::full({5}, 6, torch::kLong)));
  std::vector<torch::Tensor> avg{torch::full({3}, r)};
  comm->world().all_reduce(avg, ReduceOp::Avg);
  EXPECT_TRUE(avg[0].allclose(torch::full({3}, 1.5f)));
  EXPECT_DOUBLE_EQ(comm->world().all_reduce_scalar(0.25 * rank, ReduceOp::Sum, "loss"), 1.5);
  EXPECT_DOUBLE_EQ(comm->world().all_reduce_scalar(rank, ReduceOp::Max), 3.0);
  // All-gather: a non-contiguous part, and bfloat16, which Gloo gathers as bytes.
  const auto gathered = comm->world().all_gather(torch::arange(6, torch::kFloat).view({2, 3}).t() + 10 * rank);
  ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{4, 3, 2}));
  for (int m = 0; m < 4; ++m) {
    EXPECT_TRUE(gathered[m].equal(torch::arange(6, torch::kFloat).view({2, 3}).t() + 10 * m)) << m;
  }
  const auto halves = comm->world().all_gather(torch::full({5}, 0.5 + rank, torch::kBFloat16), "bf16 gather");
  EXPECT_TRUE(halves.to(torch::kFloat).equal(torch::arange(4, torch::kFloat).add(0.5).view({4, 1}).expand({4, 5})));

  // The grid's groups: rank = stage * 2 + replica.
  const PipeGroups g = build_pipe_groups(*comm, topo, {{"embed", {0, 1}}});
  std::vector<torch::Tensor> dp{torch::full({4}, r)};
  g.data_parallel->all_reduce(dp, ReduceOp::Avg, "data-parallel gradients");
  EXPECT_TRUE(dp[0].equal(torch::full({4}, rank < 2 ? 0.5f : 2.5f)));
  // Tied weights start equal: broadcast from the first stage holding them, as a parameter.
  auto tied = torch::full({6}, r).requires_grad_();
  std::vector<torch::Tensor> params{tied};
  auto group = g.tied_group("embed");
  ASSERT_NE(group, nullptr);
  group->broadcast(params, group->ranks().front(), "tied weights");
  EXPECT_TRUE(tied.equal(torch::full({6}, static_cast<float>(topo.rank_of(0, topo.replica_of(rank))))));
  // Global gradient norm over the pipeline of this replica.
  EXPECT_DOUBLE_EQ(g.pipeline->all_reduce_scalar(1.0 + rank), topo.replica_of(rank) == 0 ? 1.0 + 3.0 : 2.0 + 4.0);
  EXPECT_THROW(comm->new_group({"dp/stage0", {0, 1}}), ConfigError);  // name taken (or not a member)

  // A name is free again once its group is gone (a second engine in the same process), and the
  // group made again reduces among its members only, under a rendezvous of its own.
  const std::vector<int> pair = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
  for (int round = 0; round < 3; ++round) {
    const std::string name = "again/" + std::to_string(pair[0]);  // names are world-wide
    auto again = comm->new_group({name, pair});
    EXPECT_THROW(comm->new_group({name, pair}), ConfigError) << "while it lives";
    std::vector<torch::Tensor> t{torch::full({2}, r + round)};
    again->all_reduce(t, ReduceOp::Sum);
    EXPECT_TRUE(t[0].equal(torch::full({2}, static_cast<float>(pair[0] + pair[1] + 2 * round)))) << round;
  }
  // A name made before with other members on some ranks only (engine A's 'dp/stage0' was rank 0
  // alone, engine B's spans two ranks) still rendezvouses alike on every member.
  if (rank == 0) (void)comm->new_group({"relaid", {0}});
  {
    auto all = comm->new_group({"relaid", {0, 1, 2, 3}});
    std::vector<torch::Tensor> t{torch::full({1}, r)};
    all->all_reduce(t, ReduceOp::Sum, "relaid");
    EXPECT_EQ(t[0].item<float>(), 6.0f);
  }
  comm->world().barrier("end");
  comm->shutdown();
}

TEST(Collectives, GridGroupsAndBuckets) {
  testing::SpawnOptions o;
  o.nproc = 4;
  const auto run = testing::spawn_workers("collectives_grid", o);
  EXPECT_TRUE(run.ok()) << run.summary();
}

// Rank 1's sign to rank 0 that its all-reduce timed out, passed outside the communicator (a
// file named by the run's port): rank 0 stays away until then, however late a busy machine
// wakes rank 1, and only then leaves (leaving first would end the wait with a PeerError).
std::filesystem::path timed_out_flag() {
  const char* port = std::getenv("MASTER_PORT");
  return std::filesystem::temp_directory_path() /
         (std::string("pipetrain-collective-timeout-") + (port ? port : "0"));
}

PIPETRAIN_RANK_WORKER(collective_timeout) {
  auto comm = test::connect_for_test();
  if (comm->rank() == 0) {
    // Misses the all-reduce; a hang guard bounds the wait (the spawn's time limit comes first).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::filesystem::exists(timed_out_flag()) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::filesystem::remove(timed_out_flag());
    return;  // leaves with a goodbye
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    std::vector<torch::Tensor> t{torch::ones({10})};
    comm->world().all_reduce(t, ReduceOp::Sum, "gradients of step 3");
    ADD_FAILURE() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1 (rank 1): gradients of step 3 (Sum of 40 B) over group world "
                                         "[ranks 0, 1] timed out after 1 s"),
              std::string::npos)
        << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
  std::ofstream(timed_out_flag()) << "timed out\n";
}

TEST(Collectives, TimeoutNamesTheGroup) {
  testing::SpawnOptions o;
  o.env["TEST_TIMEOUT_MS"] = "1000";
  const auto run = testing::spawn_workers("collective_timeout", o);
  EXPECT_TRUE(run.ok()) << run.summary();
}

}  // namespace
}  // namespace pipetrain::comm
