// Multi-process tests: spawn N ranks (of the test binary itself, of the pipetrain CLI, or of
// any command) on 127.0.0.1 with a free port and a hard time limit; every child is reaped.
//
// A rank body is registered with PIPETRAIN_RANK_WORKER and runs in children of the current
// test binary (re-invoked with --gtest_filter=RankWorker.run and PIPETRAIN_RANK_WORKER=name):
//
//   PIPETRAIN_RANK_WORKER(ping) {            // runs in every rank
//     auto comm = pipetrain::comm::connect(pipetrain::comm::rank_info_from_env());
//     ...EXPECT_/ASSERT_ as in any test; a failure makes the rank exit 1...
//   }
//   TEST(P2P, Ping) {
//     auto run = pipetrain::testing::spawn_workers("ping", {2});
//     EXPECT_TRUE(run.ok()) << run.summary();
//   }
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/comm/launcher.h"

namespace pipetrain::testing {

struct SpawnOptions {
  int nproc = 2;
  std::chrono::milliseconds time_limit{60'000};  // hard limit: everything is killed past it
  std::map<std::string, std::string> env;        // extra environment of every rank
  std::chrono::milliseconds grace_period{2'000};
  int threads_per_rank = 1;
};

struct RankOutput {
  int rank = -1;
  bool exited = false;
  int code = 0;
  int signal = 0;
  std::string output;  // stdout and stderr, interleaved
};

struct SpawnResult {
  comm::LaunchResult launch;
  std::vector<RankOutput> ranks;  // for mpirun: one entry, mpirun itself
  double seconds = 0;
  bool ok() const { return launch.exit_code == 0 && !launch.timed_out; }
  // Exit status of every rank and the tail of its output, for assertion messages.
  std::string summary() const;
};

// Runs `command` as nproc ranks under comm::launch (torchrun variables, free port).
SpawnResult spawn_ranks(const std::vector<std::string>& command, const SpawnOptions& options);

// Runs the registered worker `name` in nproc ranks of this test binary.
SpawnResult spawn_workers(const std::string& name, const SpawnOptions& options);

// Why mpirun cannot be used here (GTEST_SKIP with it), or nullopt when it can.
std::optional<std::string> mpirun_unavailable();
// `mpirun --allow-run-as-root --oversubscribe -np N` running `command`; options.env is
// exported to the ranks with -x. The torchrun variables are not set.
SpawnResult run_mpirun(const std::vector<std::string>& command, const SpawnOptions& options);
SpawnResult mpirun_workers(const std::string& name, const SpawnOptions& options);

// Registration behind PIPETRAIN_RANK_WORKER.
bool register_rank_worker(const std::string& name, std::function<void()> body);

// The path of the running executable.
std::string self_executable();

}  // namespace pipetrain::testing

#define PIPETRAIN_RANK_WORKER(name)                                                          \
  static void pipetrain_rank_worker_##name();                                               \
  [[maybe_unused]] static const bool pipetrain_rank_worker_registered_##name =              \
      ::pipetrain::testing::register_rank_worker(#name, &pipetrain_rank_worker_##name);      \
  static void pipetrain_rank_worker_##name()
