// Process-wide logging to stderr, prefixed with the rank once the process knows it.
#include "pipetrain/util/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace pipetrain::util {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("PIPETRAIN_LOG_LEVEL");
  if (!env) return LogLevel::Info;
  const std::string s(env);
  if (s == "debug") return LogLevel::Debug;
  if (s == "warn") return LogLevel::Warn;
  if (s == "error") return LogLevel::Error;
  return LogLevel::Info;
}

std::atomic<int> g_level{static_cast<int>(initial_level())};
std::atomic<int> g_rank{-1};
std::mutex g_mutex;

const char* tag(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "debug: ";
    case LogLevel::Info: return "";
    case LogLevel::Warn: return "warning: ";
    case LogLevel::Error: return "error: ";
  }
  return "";
}

}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_rank(int rank) { g_rank = rank; }

void log(LogLevel level, const std::string& message) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::string line;
  const int rank = g_rank.load();
  if (rank >= 0) line = "[rank " + std::to_string(rank) + "] ";
  line += tag(level);
  line += message;
  line += '\n';
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace pipetrain::util
