// Starting and supervising the ranks of a job on one machine (`pipetrain launch`): torchrun's
// environment contract, intra-op threads split between ranks, signal forwarding, and when one
// rank fails, stopping the others and reporting that rank's status.
//
// launch() runs one attempt. Restarts (`--max-restarts K`, issue 6) wrap it in a loop that
// passes restart_count, which the ranks see as PIPETRAIN_RESTART_COUNT (and
// TORCHELASTIC_RESTART_COUNT, as under torchrun) to resume from their latest checkpoint.
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pipetrain::comm {

// After a rank fails (or a signal or the time limit arrives), the other ranks get SIGTERM,
// then SIGKILL once this grace period has passed.
constexpr std::chrono::milliseconds kDefaultGracePeriod{5'000};

// The most ranks per core launch() starts without LaunchOptions::oversubscribe: the tests run 8
// ranks on 2 cores; past 8 a core each rank mostly waits for its turn and every timeout is at risk.
constexpr int kMaxRanksPerCore = 8;

using EnvMap = std::map<std::string, std::string>;

struct LaunchOptions {
  TORCH_ARG(int, nproc) = 1;
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int, master_port) = 0;       // 0: pick a free port
  TORCH_ARG(int, threads_per_rank) = 0;  // 0: cores / nproc (at least 1)
  TORCH_ARG(std::chrono::milliseconds, grace_period) = kDefaultGracePeriod;
  // 0: none. Past it every rank is stopped and the result is timed_out (exit code 124).
  TORCH_ARG(std::chrono::milliseconds, time_limit) = std::chrono::milliseconds(0);
  // When set, rank r's stdout and stderr go to <log_dir>/rank_<r>.log instead of ours.
  TORCH_ARG(std::string, log_dir) = "";
  // Extra environment of every rank (applied last).
  TORCH_ARG(EnvMap, env) = {};
  // Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the
  // thread variables. Off: run the command as is (e.g. `mpirun`, which sets its own).
  TORCH_ARG(bool, torchrun_env) = true;
  // Forward SIGINT, SIGTERM and SIGHUP received by this process to every rank.
  TORCH_ARG(bool, forward_signals) = true;
  TORCH_ARG(int, restart_count) = 0;
  // More ranks than kMaxRanksPerCore x cores is refused before anything starts (a typo such as
  // --stages 1000 would otherwise fork a thousand LibTorch processes); true lifts the limit.
  TORCH_ARG(bool, oversubscribe) = false;

 public:
  void validate() const;  // ConfigError naming the bad option
};

struct RankExit {
  int rank = -1;
  int pid = -1;
  bool exited = false;  // normal exit (code) rather than killed by a signal
  int code = 0;
  int signal = 0;
  bool stopped = false;  // terminated by the launcher after another rank failed
  double end_seconds = 0;  // when it was reaped, since the launch started
  bool success() const { return exited && code == 0; }
  // "rank 1 exited with status 3", "rank 1 killed by signal 9 (SIGKILL)"
  std::string describe() const;
};

struct LaunchResult {
  int exit_code = 0;               // what `pipetrain launch` exits with
  std::optional<int> failed_rank;  // the first rank that failed
  std::string message;             // "rank 1 exited with status 3; stopped ranks 0, 2"
  std::vector<RankExit> ranks;
  bool timed_out = false;
  int interrupted_by = 0;  // the signal that stopped the job, 0 if none
  int restarts = 0;        // launch_with_restarts: how many times the group was restarted
  int master_port = 0;
  int threads_per_rank = 0;
  double seconds = 0;
};

// Starts options.nproc copies of `command` (argv[0] is looked up in PATH) and supervises them
// until all have exited. Each rank runs in its own process group and dies with this process
// (PR_SET_PDEATHSIG); when a rank fails the others are stopped and the result names it.
// ConfigError for bad options or a command that cannot be found. One launch per process at
// a time.
LaunchResult launch(const std::vector<std::string>& command, const LaunchOptions& options);

// torchrun's elastic restarts on one machine: launch(), and while a rank fails (not a time
// limit, not an interrupt) restart the whole group, at most `max_restarts` times, with
// restart_count 1, 2, ... so the ranks can resume from their latest checkpoint. `on_restart`
// hears of each failure before its restart. Returns the last attempt's result.
LaunchResult launch_with_restarts(const std::vector<std::string>& command, LaunchOptions options, int max_restarts,
                                  const std::function<void(const LaunchResult& failed, int restart)>& on_restart = {});

// "SIGKILL" for 9.
std::string signal_name(int signal);

}  // namespace pipetrain::comm
