// `pipetrain launch`: start the ranks, forward signals, stop everyone when one rank fails.
#include "pipetrain/comm/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "child_process.h"
#include "pipetrain/comm/net.h"
#include "pipetrain/comm/options.h"
#include "pipetrain/comm/threads.h"
#include "pipetrain/error.h"

extern char** environ;

namespace pipetrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Signal handlers write the signal number into this pipe; the supervision loop polls it.
std::atomic<int> g_signal_pipe{-1};

void on_signal(int sig) {
  const int saved = errno;
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    (void)!::write(fd, &byte, 1);
  }
  errno = saved;
}

// Installs the handlers for the duration of one launch and restores the previous ones.
class SignalScope {
 public:
  explicit SignalScope(bool forward) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw CommError(std::string("pipetrain launch: cannot create a pipe: ") + std::strerror(errno));
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_signal_pipe = write_fd_;
    std::vector<int> signals{SIGCHLD};
    if (forward) signals.insert(signals.end(), {SIGINT, SIGTERM, SIGHUP});
    for (int sig : signals) {
      struct sigaction action {};
      action.sa_handler = on_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
      struct sigaction old {};
      sigaction(sig, &action, &old);
      saved_.emplace_back(sig, old);
    }
  }
  ~SignalScope() {
    for (auto& [sig, old] : saved_) sigaction(sig, &old, nullptr);
    g_signal_pipe = -1;
    ::close(read_fd_);
    ::close(write_fd_);
  }
  int read_fd() const { return read_fd_; }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  std::vector<std::pair<int, struct sigaction>> saved_;
};

std::mutex g_launch_mu;  // one launch at a time: the signal pipe is process-wide

std::vector<std::string> rank_environment(const LaunchOptions& o, int rank, int port, int threads) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const auto eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  if (o.torchrun_env()) {
    vars["RANK"] = std::to_string(rank);
    vars["WORLD_SIZE"] = std::to_string(o.nproc());
    vars["LOCAL_RANK"] = std::to_string(rank);
    vars["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc());
    vars["MASTER_ADDR"] = o.master_addr();
    vars["MASTER_PORT"] = std::to_string(port);
    for (const char* name : kThreadEnvVars) vars[name] = std::to_string(threads);
  }
  vars["PIPETRAIN_RESTART_COUNT"] = std::to_string(o.restart_count());
  vars["TORCHELASTIC_RESTART_COUNT"] = std::to_string(o.restart_count());
  for (const auto& [k, v] : o.env()) vars[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGPIPE: return "SIGPIPE";
    case SIGTERM: return "SIGTERM";
    default: return "signal " + std::to_string(sig);
  }
}

std::string RankExit::describe() const {
  if (exited) return "rank " + std::to_string(rank) + " exited with status " + std::to_string(code);
  return "rank " + std::to_string(rank) + " killed by signal " + std::to_string(signal) + " (" +
         signal_name(signal) + ")";
}

void LaunchOptions::validate() const {
  if (nproc_ < 1) throw ConfigError("--nproc " + std::to_string(nproc_) + " must be >= 1");
  const int cores = available_cores();
  if (!oversubscribe_ && nproc_ > kMaxRanksPerCore * cores) {
    throw ConfigError(fmt::format(
        "{} processes on {} core{} is more than {} per core (at most {} here); use fewer stages, replicas or ranks, "
        "or pass --oversubscribe to start them anyway",
        nproc_, cores, cores == 1 ? "" : "s", kMaxRanksPerCore, kMaxRanksPerCore * cores));
  }
  if (master_port_ < 0 || master_port_ > 65535) {
    throw ConfigError("--master-port " + std::to_string(master_port_) + " is not a TCP port (1..65535, or 0 for a free one)");
  }
  if (threads_per_rank_ < 0) {
    throw ConfigError("--threads-per-rank " + std::to_string(threads_per_rank_) + " must be >= 1 (0: cores / nproc)");
  }
  if (grace_period_.count() < 0) throw ConfigError("the grace period must not be negative");
  if (time_limit_.count() < 0) throw ConfigError("the time limit must not be negative (0: none)");
  if (master_addr_.empty()) throw ConfigError("--master-addr is empty; give the address of this host (127.0.0.1)");
}

LaunchResult launch(const std::vector<std::string>& command, const LaunchOptions& options) {
  options.validate();
  if (command.empty()) {
    throw ConfigError("pipetrain launch: no command given; usage: pipetrain launch --nproc N -- CMD ARGS...");
  }
  const std::string path = detail::find_executable(command.front());
  if (path.empty()) {
    throw ConfigError("pipetrain launch: command '" + command.front() +
                      "' not found or not executable (searched PATH); give its path");
  }
  std::unique_lock<std::mutex> one_at_a_time(g_launch_mu, std::try_to_lock);
  if (!one_at_a_time) throw UsageError("launch() is already running in this process; run one at a time");

  LaunchResult result;
  result.master_port = options.master_port();
  if (options.torchrun_env() && result.master_port == 0) result.master_port = find_free_port(options.master_addr());
  result.threads_per_rank = options.threads_per_rank() > 0
                                ? options.threads_per_rank()
                                : std::max(1, available_cores() / options.nproc());

  const auto start = Clock::now();
  SignalScope signals(options.forward_signals());
  const int n = options.nproc();
  result.ranks.resize(static_cast<size_t>(n));
  std::vector<bool> running(static_cast<size_t>(n), false);
  int live = 0;
  auto send_all = [&](int sig) {
    for (int r = 0; r < n; ++r) {
      if (running[static_cast<size_t>(r)]) ::kill(-result.ranks[static_cast<size_t>(r)].pid, sig);
    }
  };
  std::optional<Clock::time_point> kill_at;  // set once stopping: SIGKILL the rest then
  auto begin_stop = [&](int sig) {
    if (kill_at) return;
    for (int r = 0; r < n; ++r) {
      if (running[static_cast<size_t>(r)]) result.ranks[static_cast<size_t>(r)].stopped = true;
    }
    send_all(sig);
    kill_at = Clock::now() + options.grace_period();
  };

  for (int r = 0; r < n; ++r) {
    detail::ChildSpec spec;
    spec.path = path;
    spec.argv = command;
    spec.env = rank_environment(options, r, result.master_port, result.threads_per_rank);
    if (!options.log_dir().empty()) spec.log_file = options.log_dir() + "/rank_" + std::to_string(r) + ".log";
    RankExit& exit = result.ranks[static_cast<size_t>(r)];
    exit.rank = r;
    try {
      exit.pid = detail::spawn_child(spec);
    } catch (...) {
      begin_stop(SIGKILL);
      while (live > 0) {
        for (int q = 0; q < r; ++q) {
          if (running[static_cast<size_t>(q)] && ::waitpid(result.ranks[static_cast<size_t>(q)].pid, nullptr, 0) > 0) {
            running[static_cast<size_t>(q)] = false;
            --live;
          }
        }
      }
      throw;
    }
    running[static_cast<size_t>(r)] = true;
    ++live;
  }

  const bool has_limit = options.time_limit().count() > 0;
  const Clock::time_point limit_at = has_limit ? start + options.time_limit() : Clock::time_point::max();
  while (live > 0) {
    // Reap whatever has exited.
    for (int r = 0; r < n; ++r) {
      if (!running[static_cast<size_t>(r)]) continue;
      RankExit& exit = result.ranks[static_cast<size_t>(r)];
      int status = 0;
      const pid_t got = ::waitpid(exit.pid, &status, WNOHANG);
      if (got != exit.pid) continue;
      running[static_cast<size_t>(r)] = false;
      --live;
      exit.exited = WIFEXITED(status);
      exit.code = exit.exited ? WEXITSTATUS(status) : 0;
      exit.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      exit.end_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      // Its process group may hold processes the rank started; they go with it.
      ::kill(-exit.pid, SIGKILL);
      if (!exit.success() && !kill_at) {
        exit.stopped = false;
        result.failed_rank = r;
        begin_stop(SIGTERM);
      }
    }
    if (live == 0) break;
    const auto now = Clock::now();
    if (kill_at && now >= *kill_at) {
      send_all(SIGKILL);
      kill_at = now + std::chrono::hours(24);  // sent; now only wait for the reaping
    }
    if (has_limit && now >= limit_at && !result.timed_out && !result.failed_rank) {
      result.timed_out = true;
      begin_stop(SIGTERM);
    }
    auto wake = now + std::chrono::milliseconds(200);  // also catches a missed SIGCHLD
    if (kill_at && *kill_at < wake) wake = *kill_at;
    if (has_limit && !result.timed_out && limit_at < wake) wake = limit_at;
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    pollfd pfd{signals.read_fd(), POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(wait_ms, 0)) + 1) > 0) {
      unsigned char bytes[64];
      const ssize_t got = ::read(signals.read_fd(), bytes, sizeof(bytes));
      for (ssize_t i = 0; i < got; ++i) {
        const int sig = bytes[i];
        if (sig == SIGCHLD) continue;
        if (!result.interrupted_by && !result.failed_rank) result.interrupted_by = sig;
        if (kill_at) {
          send_all(sig);  // a second Ctrl-C while stopping: pass it on as well
        } else {
          begin_stop(sig);
        }
      }
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<int> stopped;
  for (const RankExit& e : result.ranks) {
    if (e.stopped) stopped.push_back(e.rank);
  }
  const std::string stopped_text = stopped.empty() ? "" : "; stopped rank" + std::string(stopped.size() > 1 ? "s " : " ") + join_ranks(stopped);
  if (result.failed_rank) {
    const RankExit& f = result.ranks[static_cast<size_t>(*result.failed_rank)];
    result.exit_code = f.exited ? f.code : 128 + f.signal;
    result.message = f.describe() + stopped_text;
  } else if (result.interrupted_by) {
    result.exit_code = 128 + result.interrupted_by;
    result.message = "interrupted by " + signal_name(result.interrupted_by) + stopped_text;
  } else if (result.timed_out) {
    result.exit_code = 124;
    result.message = "time limit of " + format_duration(options.time_limit()) + " reached" + stopped_text;
  } else {
    result.exit_code = 0;
    result.message = "all " + std::to_string(n) + " ranks exited with status 0";
  }
  return result;
}

LaunchResult launch_with_restarts(const std::vector<std::string>& command, LaunchOptions options, int max_restarts,
                                  const std::function<void(const LaunchResult&, int)>& on_restart) {
  if (max_restarts < 0) {
    throw ConfigError("max_restarts must be >= 0, got " + std::to_string(max_restarts));
  }
  for (int attempt = 0;; ++attempt) {
    options.restart_count(attempt);
    LaunchResult result = launch(command, options);
    result.restarts = attempt;
    const bool retry = result.exit_code != 0 && !result.timed_out && result.interrupted_by == 0;
    if (!retry || attempt >= max_restarts) return result;
    if (on_restart) on_restart(result, attempt + 1);
  }
}

}  // namespace pipetrain::comm
