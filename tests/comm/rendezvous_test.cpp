// Joining a job: a missing rank 0 and a port already in use fail fast with what to do.
#include <gtest/gtest.h>

#include <thread>

#include "pipetrain/comm/communicator.h"
#include "pipetrain/comm/net.h"
#include "pipetrain/error.h"
#include "../../src/comm/c10d_compat.h"
#include "../../src/comm/socket_util.h"

namespace pipetrain::comm {
namespace {

using namespace std::chrono_literals;

RankInfo two_ranks(int rank, int port) {
  RankInfo info;
  info.rank = rank;
  info.world_size = 2;
  info.local_world_size = 2;
  info.local_rank = rank;
  info.master_port = port;
  info.launcher = Launcher::Torchrun;
  return info;
}

TEST(Rendezvous, MissingRankZeroTimesOut) {
  const int port = find_free_port();
  try {
    connect(two_ranks(1, port), CommOptions().connect_timeout(500ms).heartbeat_interval(100ms));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: rank 0 did not open the rendezvous store at 127.0.0.1:" +
                                         std::to_string(port) + " within 500 ms; start rank 0, and check "
                                         "MASTER_ADDR and MASTER_PORT (torchrun)"),
              std::string::npos)
        << e.what();
  }
  // The message names the 500 ms that ended the wait: a cause, not a duration (a busy machine
  // may take longer to notice it).
}

TEST(Rendezvous, PortInUseIsAConfigError) {
  auto [listener, port] = detail::listen_ephemeral("0.0.0.0");
  try {
    connect(two_ranks(0, port), CommOptions().connect_timeout(500ms).heartbeat_interval(100ms));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT " + std::to_string(port) + " is already in use"),
              std::string::npos)
        << e.what();
  }
}

// A store on `port` held by someone else: torch.distributed in this process (multi-tenant, as its
// env:// and tcp:// rendezvous make it) or torchrun's agent (another process: not shareable).
c10::intrusive_ptr<c10d::TCPStore> foreign_store(int port, bool multi_tenant) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = true;
  so.multiTenant = multi_tenant;
  so.waitWorkers = false;
  detail::use_plain_socket_store(so);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
}

// Both ranks (threads) connect and reduce over the world.
void connect_both(const RankInfo& rank0, const RankInfo& rank1) {
  const auto options = CommOptions().connect_timeout(20s).timeout(20s).heartbeat_interval(100ms);
  std::vector<double> sums(2, 0.0);
  std::vector<std::string> errors(2);
  auto run = [&](const RankInfo& info) {
    try {
      auto comm = connect(info, options);
      sums[static_cast<size_t>(info.rank)] = comm->world().all_reduce_scalar(info.rank + 1.0);
      comm->shutdown();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(info.rank)] = e.what();
    }
  };
  std::thread one([&] { run(rank1); });
  run(rank0);
  one.join();
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(sums, (std::vector<double>{3.0, 3.0}));
}

TEST(Rendezvous, SharesTheStoreOfTorchDistributedInTheSameProcess) {
  const int port = find_free_port();
  auto torch_store = foreign_store(port, /*multi_tenant=*/true);  // init_process_group came first
  connect_both(two_ranks(0, port), two_ranks(1, port));
}

TEST(Rendezvous, JoinsTheStoreOfTorchrunsAgent) {
  const int port = find_free_port();
  auto agent = foreign_store(port, /*multi_tenant=*/false);
  RankInfo rank0 = two_ranks(0, port), rank1 = two_ranks(1, port);
  rank0.agent_store = rank1.agent_store = true;
  rank0.restart_count = rank1.restart_count = 3;
  connect_both(rank0, rank1);
  EXPECT_GT(agent->getNumKeys(), 0) << "the ranks' keys are in the agent's store";
  // Without the agent's variable rank 0 would serve on the agent's port itself.
  EXPECT_THROW(connect(two_ranks(0, port), CommOptions().connect_timeout(500ms)), ConfigError);
}

TEST(Rendezvous, MissingPeerOfTheMonitorTimesOut) {
  // Rank 0 alone: the store opens, but rank 1 never joins.
  try {
    connect(two_ranks(0, find_free_port()), CommOptions().connect_timeout(500ms).heartbeat_interval(100ms));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: rank 1 did not join within 500 ms"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, Addresses) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_EQ(local_address_towards("127.0.0.1"), "127.0.0.1");
  EXPECT_GT(find_free_port(), 0);
  EXPECT_THROW(local_address_towards("no-such-host.invalid"), ConfigError);
}

}  // namespace
}  // namespace pipetrain::comm
