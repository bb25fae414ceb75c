// The `schedule` and `simulate` subcommands and the options they share.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::apps {

void add_schedule_command(CLI::App& app, int& exit_code);
void add_simulate_command(CLI::App& app, int& exit_code);

// The options both commands take, as typed; checked in generate() so that every bad value
// gets the same one-line error and usage (CLI11's own checks would print something else).
struct ScheduleArgs {
  std::string kind, stages, micro_batches, chunks, stage, format = "text";
  std::string from_csv;    // --from-csv FILE: torch's schedule CSV instead of a kind
  bool with_comm = false;  // --with-comm: --format csv writes sends and receives too

  void add_to(CLI::App& command);
  // Throws ConfigError (a value missing or malformed) or ScheduleError (the kind cannot be
  // generated with these values), each with a one-line message. With --from-csv, reads the
  // file instead (P, V, M and the layout come from it; --kind and the counts must be absent).
  schedule::Schedule generate() const;
  std::optional<int> only_stage(int num_stages) const;  // --stage S, checked against P
  bool json() const;                                    // --format json
  bool csv() const;                                     // --format csv (torch's)
};

// "usage: pipetrain schedule --kind ... [--format text|json]"
extern const char* const kScheduleUsage;

// Runs `body`. A ConfigError or ScheduleError (a bad argument) prints
// "pipetrain <command>: error: <message>" and `usage` to stderr and returns 2; another
// pipetrain::Error prints the message alone and returns 1; success returns 0.
int run_command(const char* command, const std::string& usage, const std::function<void()>& body);

// Leftover arguments CLI11 did not recognise (the commands allow extras so that they can
// report them with the usage): throws ConfigError naming the first.
void reject_extras(const CLI::App& command);

// A finite number >= 0 for `option`; throws ConfigError.
double parse_cost(const std::string& option, const std::string& text);

}  // namespace pipetrain::apps
