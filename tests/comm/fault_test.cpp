// Faults: a SIGKILLed rank, a rank that reports an error, a hung rank. Every other rank's
// pending and later operations fail quickly with PeerError naming the rank it lost, and
// the time from the fault to each survivor's exit is measured.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <thread>

#include "pipetrain/error.h"
#include "support/ranks.h"
#include "worker_util.h"

namespace pipetrain::comm {
namespace {

using namespace std::chrono_literals;

// Exit codes of survivors: the error named the lost rank / it did not / no error at all.
constexpr int kNamedIt = 42;
constexpr int kWrongMessage = 43;
constexpr int kNoError = 44;

// Runs `body` (which must fail with a CommError), tears the communicator down, prints the
// message and exits like a program that caught the error in main.
[[noreturn]] void survive(const std::function<void(Communicator&)>& body, const std::string& must_contain) {
  signal(SIGTERM, SIG_IGN);  // the launcher would stop us; we must notice the fault ourselves
  std::string message;
  double detected = 0;
  try {
    auto comm = test::connect_for_test();
    comm->world().barrier("start");
    try {
      body(*comm);
    } catch (const CommError&) {
      detected = test::now_ms();
      throw;
    }
  } catch (const CommError& e) {
    message = e.what();
  }
  // The parent compares these with the faulty rank's FAULT_AT to get the detection latency.
  std::printf("DETECTED_AT=%.3f\nTORN_DOWN_AT=%.3f\nERROR: %s\n", detected, test::now_ms(), message.c_str());
  std::fflush(stdout);
  std::exit(message.empty() ? kNoError : message.find(must_contain) != std::string::npos ? kNamedIt : kWrongMessage);
}

void announce_fault() {
  std::printf("FAULT_AT=%.3f\n", test::now_ms());
  std::fflush(stdout);
}

void die_after_start(Communicator&) {
  std::this_thread::sleep_for(300ms);
  announce_fault();
  raise(SIGKILL);
}

// Rank 0 dies while rank 1 waits on it directly and rank 2 waits on rank 1.
PIPETRAIN_RANK_WORKER(fault_kill_p2p) {
  survive(
      [](Communicator& c) {
        if (c.rank() == 0) die_after_start(c);
        c.channel().irecv(c.rank() - 1, Stream::activation(), "activation of micro-batch 0").wait();
      },
      "stage 0 (rank 0) died");
}

// Rank 0 dies during an all-reduce of 4 ranks; rank 3 is busy computing (in no operation) until
// its liveness monitor has seen the death, and only then starts a send to rank 2, which must
// fail at once. (It waits for the monitor, not for a fixed time, which a busy machine stretches.)
PIPETRAIN_RANK_WORKER(fault_kill_collective) {
  survive(
      [](Communicator& c) {
        if (c.rank() == 0) die_after_start(c);
        if (c.rank() == 3) {
          const auto until = std::chrono::steady_clock::now() + 120s;  // a hang guard
          while (!c.fault() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
          c.channel().isend(2, Stream::gradient(), Batch(torch::ones({4})), "gradient of micro-batch 1").wait();
          return;
        }
        std::vector<torch::Tensor> t{torch::ones({1 << 16})};
        c.world().all_reduce(t, ReduceOp::Sum, "gradients");
      },
      "stage 0 (rank 0) died");
}

// Rank 0 reports why it stops, then exits with status 3.
PIPETRAIN_RANK_WORKER(fault_reported) {
  survive(
      [](Communicator& c) {
        if (c.rank() == 0) {
          announce_fault();
          c.report_failure("batch of micro-batch 4 has shape [3, 5], expected [32, 1024]");
          std::exit(3);
        }
        c.channel().irecv(0, Stream::activation(), "activation of micro-batch 4").wait();
      },
      "stage 0 (rank 0) failed: batch of micro-batch 4 has shape [3, 5]");
}

// Rank 0 hangs (SIGSTOP): only its silence tells, after the heartbeat timeout.
PIPETRAIN_RANK_WORKER(fault_hung) {
  survive(
      [](Communicator& c) {
        if (c.rank() == 0) {
          std::this_thread::sleep_for(300ms);
          announce_fault();
          raise(SIGSTOP);
        }
        c.channel().irecv(0, Stream::activation(), "activation of micro-batch 0").wait();
      },
      "stage 0 (rank 0) stopped answering");
}

double value_in(const std::string& text, const std::string& key) {
  const auto pos = text.find(key + "=");
  return pos == std::string::npos ? 0.0 : std::atof(text.c_str() + pos + key.size() + 1);
}

// Every survivor named the lost rank and the way it was lost (a death, a report, silence), and
// exited on its own; prints the time from the fault to its error and to its exit. The times are
// not bounded: the runs below give every operation a 600 s timeout, so a survivor that learned
// of the fault from a timeout, or whose teardown waited for one, is still running when the
// launcher's grace period (60 s) or time limit (120 s) ends it, and fails by its cause (killed,
// not exited with the fault's message), however busy the machine.
// Returns the largest detection latency in seconds.
double check_survivors(const testing::SpawnResult& run, const std::string& label) {
  const double fault_ms = value_in(run.ranks.at(0).output, "FAULT_AT");
  EXPECT_GT(fault_ms, 0) << run.summary();
  double worst = 0;
  for (const auto& r : run.ranks) {
    if (r.rank == 0) continue;
    EXPECT_TRUE(r.exited) << run.summary();
    EXPECT_EQ(r.code, kNamedIt) << run.summary();
    const double detect = (value_in(r.output, "DETECTED_AT") - fault_ms) / 1000.0;
    const double torn_down = (value_in(r.output, "TORN_DOWN_AT") - fault_ms) / 1000.0;
    const double exited = r.exited ? run.launch.ranks[static_cast<size_t>(r.rank)].end_seconds -
                                         run.launch.ranks[0].end_seconds
                                   : -1;
    std::printf("[ fault    ] %s: rank %d error after %.3f s, torn down after %.3f s", label.c_str(), r.rank, detect,
                torn_down);
    if (exited >= 0) {
      std::printf(", exit %.3f s after rank 0's", exited);
    }
    std::printf("\n");
    worst = std::max(worst, detect);
  }
  return worst;
}

TEST(Faults, KilledRankIsNamedByDirectAndIndirectPeers) {
  testing::SpawnOptions o;
  o.nproc = 3;
  o.grace_period = 60s;  // survivors ignore SIGTERM; they must exit on their own
  o.time_limit = 120s;
  o.env["TEST_TIMEOUT_MS"] = "600000";
  const auto run = testing::spawn_workers("fault_kill_p2p", o);
  ASSERT_FALSE(run.launch.ranks[0].exited) << run.summary();
  EXPECT_EQ(run.launch.ranks[0].signal, SIGKILL);
  EXPECT_EQ(run.launch.failed_rank, 0);
  check_survivors(run, "SIGKILL during recv");
}

TEST(Faults, KilledRankDuringAllReduce) {
  testing::SpawnOptions o;
  o.nproc = 4;
  o.grace_period = 60s;
  o.time_limit = 120s;
  o.env["TEST_TIMEOUT_MS"] = "600000";
  const auto run = testing::spawn_workers("fault_kill_collective", o);
  EXPECT_EQ(run.launch.ranks[0].signal, SIGKILL) << run.summary();
  check_survivors(run, "SIGKILL during all-reduce");
}

TEST(Faults, ReportedFailureIsNamed) {
  testing::SpawnOptions o;
  o.grace_period = 60s;
  o.time_limit = 120s;
  o.env["TEST_TIMEOUT_MS"] = "600000";
  const auto run = testing::spawn_workers("fault_reported", o);
  EXPECT_EQ(run.launch.ranks[0].code, 3) << run.summary();
  check_survivors(run, "reported failure");
}

TEST(Faults, HungRankIsNamedAfterHeartbeatTimeout) {
  testing::SpawnOptions o;
  o.grace_period = 1s;
  o.time_limit = 120s;
  o.env["TEST_TIMEOUT_MS"] = "600000";
  o.env["TEST_HEARTBEAT_MS"] = "200";
  o.env["TEST_HEARTBEAT_TIMEOUT_MS"] = "2000";
  const auto run = testing::spawn_workers("fault_hung", o);
  ASSERT_EQ(run.launch.ranks.size(), 2u);
  // Detected by silence ("stopped answering"): not before the 2 s heartbeat timeout, and not by
  // the 600 s op timeout (the launcher's 120 s limit would have ended the run first).
  const double detect = check_survivors(run, "hung (SIGSTOP) rank, heartbeat timeout 2 s");
  EXPECT_GT(detect, 1.5) << run.summary();
  EXPECT_EQ(run.launch.ranks[0].signal, SIGKILL);  // the launcher cleaned the stopped rank up
}

}  // namespace
}  // namespace pipetrain::comm
