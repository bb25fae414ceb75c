// `pipetrain launch` and comm::launch: the torchrun environment, failure propagation with
// the failed rank's status, SIGTERM then SIGKILL of the others, signal forwarding, and no
// process left behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "pipetrain/comm/launcher.h"
#include "pipetrain/comm/threads.h"
#include "pipetrain/error.h"
#include "support/child_process.h"
#include "support/ranks.h"

namespace pipetrain::comm {
namespace {

using namespace std::chrono_literals;
using testing::SpawnOptions;

testing::SpawnResult sh(const std::string& script, int nproc, std::chrono::milliseconds grace = 2s) {
  SpawnOptions o;
  o.nproc = nproc;
  o.grace_period = grace;
  // Far beyond what these scripts take, and below their sleeps: a run the launcher failed to stop
  // ends here, timed out, which the tests tell from a stop by its cause.
  o.time_limit = 120s;
  return testing::spawn_ranks({"sh", "-c", script}, o);
}

TEST(Launch, SetsTorchrunEnvironment) {
  const auto run = sh("echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
                      "addr=$MASTER_ADDR port=$MASTER_PORT omp=$OMP_NUM_THREADS blas=$OPENBLAS_NUM_THREADS "
                      "restart=$PIPETRAIN_RESTART_COUNT",
                      3);
  ASSERT_TRUE(run.ok()) << run.summary();
  EXPECT_EQ(run.launch.message, "all 3 ranks exited with status 0");
  for (int r = 0; r < 3; ++r) {
    const std::string expected = "rank=" + std::to_string(r) + " world=3 local=" + std::to_string(r) +
                                 "/3 addr=127.0.0.1 port=" + std::to_string(run.launch.master_port) +
                                 " omp=1 blas=1 restart=0\n";
    EXPECT_EQ(run.ranks[static_cast<size_t>(r)].output, expected);
  }
  EXPECT_GT(run.launch.master_port, 0);
}

TEST(Launch, SplitsCoresBetweenRanksByDefault) {
  LaunchOptions o;
  o.nproc(2).log_dir("");
  const auto dir = std::filesystem::temp_directory_path() / ("pipetrain-launch-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  o.log_dir(dir.string());
  const LaunchResult result = launch({"sh", "-c", "echo $OMP_NUM_THREADS"}, o);
  ASSERT_EQ(result.exit_code, 0) << result.message;
  EXPECT_EQ(result.threads_per_rank, std::max(1, available_cores() / 2));
  std::ifstream in(dir / "rank_1.log");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, std::to_string(result.threads_per_rank));
  std::filesystem::remove_all(dir);
}

TEST(Launch, FailedRankStopsTheOthersAndGivesItsStatus) {
  const auto run = sh("if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 600", 3);
  EXPECT_EQ(run.launch.exit_code, 3);
  EXPECT_EQ(run.launch.failed_rank, 1);
  EXPECT_EQ(run.launch.message, "rank 1 exited with status 3; stopped ranks 0, 2");
  EXPECT_EQ(run.launch.ranks[0].signal, SIGTERM);
  EXPECT_TRUE(run.launch.ranks[2].stopped);
  EXPECT_FALSE(run.launch.timed_out) << "stopped by the failure, not by the time limit";
}

TEST(Launch, KilledRankIsNamedWithItsSignal) {
  const auto run = sh("if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 600", 2);
  EXPECT_EQ(run.launch.exit_code, 128 + SIGKILL);
  EXPECT_EQ(run.launch.message, "rank 1 killed by signal 9 (SIGKILL); stopped rank 0");
}

TEST(Launch, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  const auto run = sh("trap '' TERM; if [ \"$RANK\" = 0 ]; then sleep 0.5; exit 5; fi; sleep 600", 2, 500ms);
  EXPECT_EQ(run.launch.exit_code, 5);
  EXPECT_EQ(run.launch.ranks[1].signal, SIGKILL);
  EXPECT_FALSE(run.launch.timed_out) << "killed after the grace period, not by the time limit";
}

TEST(Launch, RestartsTheGroupAfterAFailureUpToTheLimit) {
  LaunchOptions o;
  o.nproc(2).time_limit(30s).grace_period(2s);
  // Rank 1 fails on the first attempt only; every rank sees the restart count.
  const std::vector<std::string> flaky{
      "sh", "-c", "if [ \"$RANK\" = 1 ] && [ \"$PIPETRAIN_RESTART_COUNT\" = 0 ]; then exit 3; fi; "
                  "test \"$TORCHELASTIC_RESTART_COUNT\" = \"$PIPETRAIN_RESTART_COUNT\""};
  std::vector<std::string> heard;
  auto result = launch_with_restarts(flaky, o, 2, [&](const LaunchResult& failed, int restart) {
    heard.push_back(failed.message + " -> restart " + std::to_string(restart));
  });
  EXPECT_EQ(result.exit_code, 0) << result.message;
  EXPECT_EQ(result.restarts, 1);
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0].rfind("rank 1 exited with status 3", 0), 0u) << heard[0];
  EXPECT_NE(heard[0].find("-> restart 1"), std::string::npos);

  // Always failing: the limit holds and the last failure is returned.
  result = launch_with_restarts({"sh", "-c", "exit 4"}, o, 2);
  EXPECT_EQ(result.exit_code, 4);
  EXPECT_EQ(result.restarts, 2);
  // A time limit is not a fault to retry.
  o.time_limit(300ms).grace_period(300ms);
  result = launch_with_restarts({"sleep", "30"}, o, 3);
  EXPECT_TRUE(result.timed_out);
  EXPECT_EQ(result.restarts, 0);
  EXPECT_THROW(launch_with_restarts({"true"}, o, -1), ConfigError);
}

TEST(Launch, TimeLimitStopsEveryRank) {
  SpawnOptions o;
  o.nproc = 2;
  o.time_limit = 500ms;
  o.grace_period = 500ms;
  const auto run = testing::spawn_ranks({"sleep", "30"}, o);
  EXPECT_TRUE(run.launch.timed_out);
  EXPECT_EQ(run.launch.exit_code, 124);
  EXPECT_EQ(run.launch.message, "time limit of 500 ms reached; stopped ranks 0, 1");
}

TEST(Launch, BadOptionsAndCommands) {
  EXPECT_THROW(launch({"definitely-not-a-command-xyz"}, LaunchOptions()), ConfigError);
  EXPECT_THROW(launch({}, LaunchOptions()), ConfigError);
  EXPECT_THROW(launch({"true"}, LaunchOptions().nproc(0)), ConfigError);
  EXPECT_THROW(launch({"true"}, LaunchOptions().master_port(70000)), ConfigError);
}

// Runs the pipetrain CLI as a child process (not through launch(), so the test can signal it).
struct CliProcess : testing::ChildProcess {
  CliProcess(const std::vector<std::string>& args, const std::string& log_path)
      : ChildProcess(with_cli(args), log_path) {}
  static std::vector<std::string> with_cli(std::vector<std::string> args) {
    args.insert(args.begin(), PIPETRAIN_CLI_PATH);
    return args;
  }
};

std::vector<int> pids_in(const std::string& text, const std::string& tag) {
  std::vector<int> pids;
  const std::regex re(tag + "=([0-9]+)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) pids.push_back(std::stoi((*it)[1]));
  return pids;
}

// Running (a zombie waiting for a reaper that is not us counts as gone).
bool alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Waits until none of `pids` runs; false if one still does after `limit` (a hang guard: the
// processes here would otherwise sleep 600 s).
bool all_gone(const std::vector<int>& pids, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (true) {
    bool any_alive = false;
    for (int pid : pids) any_alive = any_alive || alive(pid);
    if (!any_alive) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(20ms);
  }
}

std::string temp_log(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()) + ".log")).string();
}

TEST(LaunchCli, ExitsWithTheFailedRanksStatusAndNamesIt) {
  CliProcess cli({"launch", "--nproc", "2", "--", "sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 600"},
                 temp_log("launch-fail"));
  EXPECT_EQ(cli.wait(120s), 3);
  EXPECT_NE(cli.output().find("pipetrain launch: rank 1 exited with status 3; stopped rank 0"), std::string::npos)
      << cli.output();
}

TEST(LaunchCli, MaxRestartsRestartsTheGroupAndSaysSo) {
  CliProcess cli({"launch", "--nproc", "2", "--max-restarts", "1", "--", "sh", "-c",
                  "if [ \"$RANK\" = 0 ] && [ \"$PIPETRAIN_RESTART_COUNT\" = 0 ]; then exit 7; fi; exit 0"},
                 temp_log("launch-restart"));
  EXPECT_EQ(cli.wait(120s), 0) << cli.output();
  EXPECT_NE(cli.output().find("pipetrain launch: rank 0 exited with status 7"), std::string::npos) << cli.output();
  EXPECT_NE(cli.output().find("restarting all ranks (1 of 1)"), std::string::npos) << cli.output();
}

TEST(LaunchCli, ForwardsSigtermAndLeavesNoProcessBehind) {
  // Each rank reports its pid and its child's, then waits; on SIGTERM it says so and exits 5.
  CliProcess cli({"launch", "--nproc", "2", "--grace-period", "5", "--", "sh", "-c",
                  "trap 'echo got-TERM-$RANK; exit 5' TERM; sleep 600 & echo rank-pid=$$ child-pid=$!; wait"},
                 temp_log("launch-signal"));
  ASSERT_TRUE(cli.wait_for("rank-pid=", 2, 120s)) << cli.output();
  kill(cli.pid, SIGTERM);
  EXPECT_EQ(cli.wait(120s), 128 + SIGTERM);
  const std::string out = cli.output();
  EXPECT_NE(out.find("got-TERM-0"), std::string::npos) << out;
  EXPECT_NE(out.find("got-TERM-1"), std::string::npos) << out;
  EXPECT_NE(out.find("pipetrain launch: interrupted by SIGTERM; stopped ranks 0, 1"), std::string::npos) << out;
  // Signalled processes take a moment to die (longer on a busy machine): poll, bounded far below
  // their 600 s sleep.
  auto pids = pids_in(out, "rank-pid");
  const auto children = pids_in(out, "child-pid");
  pids.insert(pids.end(), children.begin(), children.end());
  EXPECT_EQ(pids.size(), 4u) << out;
  EXPECT_TRUE(all_gone(pids, 120s)) << "a rank or its child outlived the launcher";
}

TEST(LaunchCli, RanksDieWithAKilledLauncher) {
  CliProcess cli({"launch", "--nproc", "2", "--", "sh", "-c", "echo rank-pid=$$; exec sleep 600"},
                 temp_log("launch-pdeath"));
  ASSERT_TRUE(cli.wait_for("rank-pid=", 2, 120s)) << cli.output();
  const auto pids = pids_in(cli.output(), "rank-pid");
  kill(cli.pid, SIGKILL);
  EXPECT_EQ(cli.wait(120s), 128 + SIGKILL);
  EXPECT_TRUE(all_gone(pids, 120s)) << "ranks survived their launcher (PR_SET_PDEATHSIG)";
}

}  // namespace
}  // namespace pipetrain::comm
