// Joining a job: a missing rank 0 and a port already in use fail fast with what to do.
#include <gtest/gtest.h>

#include <thread>

#include "pipetrain/comm/communicator.h"
#include "pipetrain/comm/net.h"
#include "pipetrain/error.h"
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
  const auto start = std::chrono::steady_clock::now();
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
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
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
