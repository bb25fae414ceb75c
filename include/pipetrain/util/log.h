// Process-wide logging to stderr, prefixed with the rank once the process knows it.
#pragma once

#include <string>

namespace pipetrain::util {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Prefixes every later line with "[rank R]"; a negative rank removes the prefix.
void set_log_rank(int rank);

// Thread-safe: a line is written whole.
void log(LogLevel level, const std::string& message);
inline void log_debug(const std::string& m) { log(LogLevel::Debug, m); }
inline void log_info(const std::string& m) { log(LogLevel::Info, m); }
inline void log_warn(const std::string& m) { log(LogLevel::Warn, m); }
inline void log_error(const std::string& m) { log(LogLevel::Error, m); }

}  // namespace pipetrain::util
