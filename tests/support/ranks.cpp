// Multi-process test harness: spawning ranks with a time limit and collecting their output.
#include "ranks.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "pipetrain/comm/net.h"

namespace pipetrain::testing {
namespace {

constexpr const char* kWorkerEnv = "PIPETRAIN_RANK_WORKER";

std::map<std::string, std::function<void()>>& registry() {
  static std::map<std::string, std::function<void()>> workers;
  return workers;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string make_temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "pipetrain-ranks-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

SpawnResult run(const std::vector<std::string>& command, const SpawnOptions& o, int nproc, bool torchrun) {
  const std::string dir = make_temp_dir();
  comm::LaunchOptions lo;
  lo.nproc(nproc)
      .master_addr("127.0.0.1")
      .master_port(torchrun ? comm::find_free_port() : 0)
      .threads_per_rank(o.threads_per_rank)
      .grace_period(o.grace_period)
      .time_limit(o.time_limit)
      .log_dir(dir)
      .env(o.env)
      .torchrun_env(torchrun)
      .forward_signals(false);
  SpawnResult result;
  result.launch = comm::launch(command, lo);
  result.seconds = result.launch.seconds;
  for (const comm::RankExit& e : result.launch.ranks) {
    RankOutput out;
    out.rank = e.rank;
    out.exited = e.exited;
    out.code = e.code;
    out.signal = e.signal;
    out.output = read_file(dir + "/rank_" + std::to_string(e.rank) + ".log");
    result.ranks.push_back(std::move(out));
  }
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace

std::string SpawnResult::summary() const {
  std::ostringstream s;
  s << "launch: exit " << launch.exit_code << " (" << launch.message << ") after " << seconds << " s\n";
  for (const RankOutput& r : ranks) {
    s << "--- rank " << r.rank << ": "
      << (r.exited ? "exit " + std::to_string(r.code) : "signal " + std::to_string(r.signal)) << "\n";
    const std::string& text = r.output;
    s << (text.size() > 4000 ? "..." + text.substr(text.size() - 4000) : text) << "\n";
  }
  return s.str();
}

std::string self_executable() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

bool register_rank_worker(const std::string& name, std::function<void()> body) {
  registry()[name] = std::move(body);
  return true;
}

SpawnResult spawn_ranks(const std::vector<std::string>& command, const SpawnOptions& options) {
  return run(command, options, options.nproc, true);
}

std::vector<std::string> worker_command() {
  return {self_executable(), "--gtest_filter=RankWorker.run", "--gtest_brief=1"};
}

SpawnResult spawn_workers(const std::string& name, const SpawnOptions& options) {
  SpawnOptions o = options;
  o.env[kWorkerEnv] = name;
  return spawn_ranks(worker_command(), o);
}

std::optional<std::string> mpirun_unavailable() {
  if (access("/usr/bin/mpirun", X_OK) != 0 && system("command -v mpirun >/dev/null 2>&1") != 0) {
    return "mpirun is not installed (Debian package openmpi-bin)";
  }
  return std::nullopt;
}

SpawnResult run_mpirun(const std::vector<std::string>& command, const SpawnOptions& options) {
  std::vector<std::string> argv{"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                                "-np", std::to_string(options.nproc)};
  SpawnOptions o = options;
  o.env["OMP_NUM_THREADS"] = std::to_string(options.threads_per_rank);
  for (const auto& [k, v] : o.env) {
    argv.push_back("-x");
    argv.push_back(k + "=" + v);
  }
  argv.insert(argv.end(), command.begin(), command.end());
  // mpirun's children inherit our environment: keep torchrun's variables out of it, they
  // would take precedence over OMPI_COMM_WORLD_*.
  for (const char* var : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(var);
  }
  return run(argv, o, 1, false);
}

SpawnResult mpirun_workers(const std::string& name, const SpawnOptions& options) {
  SpawnOptions o = options;
  o.env[kWorkerEnv] = name;
  return run_mpirun(worker_command(), o);
}

}  // namespace pipetrain::testing

// The entry point of spawned ranks; a plain test run skips it.
TEST(RankWorker, run) {
  const char* name = std::getenv("PIPETRAIN_RANK_WORKER");
  if (name == nullptr) GTEST_SKIP() << "runs only inside ranks started by spawn_workers()";
  auto& workers = pipetrain::testing::registry();
  auto it = workers.find(name);
  ASSERT_NE(it, workers.end()) << "no rank worker named " << name << " in this binary";
  it->second();
}
