// A child process for tests: its own process group, output to a log file, waits with deadlines
// (a test that outlives them kills the group instead of hanging CI).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace pipetrain::testing {

struct ChildProcess {
  pid_t pid = -1;
  std::string log;

  ChildProcess(std::vector<std::string> argv, const std::string& log_path) : log(log_path) {
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> raw;
      for (auto& a : argv) raw.push_back(a.data());
      raw.push_back(nullptr);
      execvp(raw[0], raw.data());
      _exit(127);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  std::string output() const {
    std::ifstream in(log);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Waits until the output contains `count` occurrences of `needle` (or the deadline).
  bool wait_for(const std::string& needle, int count, std::chrono::milliseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      const std::string out = output();
      int found = 0;
      for (size_t pos = out.find(needle); pos != std::string::npos; pos = out.find(needle, pos + 1)) ++found;
      if (found >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Exit status (128 + signal when killed), or -1 if it did not end in time (then its group is
  // killed).
  int wait(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (pid > 0) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (pid > 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      pid = -1;
    }
    return -1;
  }
  ~ChildProcess() {
    if (pid > 0) wait(std::chrono::milliseconds(0));
  }
};

}  // namespace pipetrain::testing
