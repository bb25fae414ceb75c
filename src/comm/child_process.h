// Forking a rank: own process group, death signal tied to the launcher, clean signal state.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace pipetrain::comm::detail {

struct ChildSpec {
  std::string path;               // resolved executable
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=value"
  std::string log_file;           // stdout+stderr go here when not empty
};

// Starts the child and returns its pid. The child leads its own process group (so a signal
// to -pid reaches anything it starts), receives SIGKILL if this process dies, and starts
// with default signal dispositions and an empty signal mask. CommError when fork fails,
// ConfigError when the log file cannot be created.
pid_t spawn_child(const ChildSpec& spec);

// The path execve needs for `name`: itself when it contains '/', else the first executable
// match in PATH; "" when there is none.
std::string find_executable(const std::string& name);

}  // namespace pipetrain::comm::detail
