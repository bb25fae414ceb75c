// The same multi-rank exchange started by other launchers: OpenMPI's mpirun (rendezvous from
// OMPI_COMM_WORLD_* with a derived port) and torchrun's variables set by hand.
#include <gtest/gtest.h>

#include "pipetrain/comm/net.h"
#include "support/ranks.h"
#include "worker_util.h"

namespace pipetrain::comm {
namespace {

// Checks which launcher was detected, then runs a round of p2p and an all-reduce.
PIPETRAIN_RANK_WORKER(launcher_exchange) {
  const RankInfo info = rank_info_from_env();
  const char* expected = std::getenv("EXPECT_LAUNCHER");
  ASSERT_NE(expected, nullptr);
  EXPECT_EQ(to_string(info.launcher), expected) << info.describe();
  EXPECT_EQ(info.world_size, 2);
  auto comm = connect(info, test::test_options(info.world_size));
  const int peer = 1 - comm->rank();
  for (int i = 0; i < 4; ++i) {
    auto r = comm->channel().irecv(peer, Stream::activation(), "message " + std::to_string(i));
    auto mask = torch::arange(6 + i).lt(3);
    comm->channel().isend(peer, Stream::activation(), Batch::tuple({torch::full({6 + i}, 10.0 * comm->rank() + i), mask}),
                          "message " + std::to_string(i));
    const Batch got = r.wait();
    EXPECT_TRUE(got[0].equal(torch::full({6 + i}, 10.0 * peer + i)));
    EXPECT_TRUE(got[1].equal(mask));
  }
  std::vector<torch::Tensor> t{torch::full({3}, 1.0f + comm->rank())};
  comm->world().all_reduce(t);
  EXPECT_TRUE(t[0].equal(torch::full({3}, 3.0f)));
  comm->shutdown();
  std::printf("launcher %s, %s\n", expected, info.describe().c_str());
}

TEST(Launchers, Mpirun) {
  if (auto why = testing::mpirun_unavailable()) GTEST_SKIP() << *why;
  testing::SpawnOptions o;
  o.env["EXPECT_LAUNCHER"] = "OpenMPI";
  // MASTER_ADDR and MASTER_PORT are derived: loopback (all ranks local), port from the job id.
  const auto run = testing::mpirun_workers("launcher_exchange", o);
  EXPECT_TRUE(run.ok()) << run.summary();
  EXPECT_NE(run.ranks.at(0).output.find("via OpenMPI, master 127.0.0.1:"), std::string::npos) << run.summary();
}

TEST(Launchers, TorchrunVariablesSetByHand) {
  const int port = find_free_port();
  const std::string worker = testing::self_executable() + " --gtest_filter=RankWorker.run --gtest_brief=1";
  const std::string common = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                             " PIPETRAIN_RANK_WORKER=launcher_exchange EXPECT_LAUNCHER=torchrun ";
  // What a user of a working torchrun would get: `torchrun --nproc_per_node 2 --no_python CMD`.
  const std::string script = common + "RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 " + worker + " & a=$!; " + common +
                             "RANK=1 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 " + worker + "; b=$?; wait $a; a=$?; " +
                             "test $a = 0 -a $b = 0";
  testing::SpawnOptions o;
  o.nproc = 1;
  const auto run = testing::spawn_ranks({"sh", "-c", script}, o);
  EXPECT_TRUE(run.ok()) << run.summary();
}

}  // namespace
}  // namespace pipetrain::comm
