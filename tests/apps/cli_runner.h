// Runs the `pipetrain` command line in this process and captures what it prints.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/commands.h"

namespace pipetrain::apps::testing {

struct CliRun {
  int code;
  std::string out, err;
};

// run({"schedule", "--kind", "1f1b"}) runs `pipetrain schedule --kind 1f1b`.
inline CliRun run(std::vector<std::string> args) {
  args.insert(args.begin(), "pipetrain");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = run_cli(static_cast<int>(argv.size()), argv.data());
  CliRun r{code, ::testing::internal::GetCapturedStdout(), ::testing::internal::GetCapturedStderr()};
  return r;
}

// The last non-empty line (the JSON summary of most commands).
inline std::string last_line(const std::string& text) {
  const auto end = text.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const auto begin = text.rfind('\n', end);
  const size_t first = begin == std::string::npos ? 0 : begin + 1;
  return text.substr(first, end - first + 1);
}

}  // namespace pipetrain::apps::testing
