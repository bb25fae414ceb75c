// The subcommands of the `pipetrain` tool; each file in src/apps adds one.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace pipetrain::apps {

// Each add_*_command registers a subcommand on `app`; the callback it installs runs the
// command and stores the process exit code in `exit_code`.
using CommandAdder = void (*)(CLI::App& app, int& exit_code);

// Builds the whole command-line interface.
void add_all_commands(CLI::App& app, int& exit_code);

// Bounds for numeric options whose error says the bound and the value ("--steps: must be > 0,
// got -3"); CLI11's PositiveNumber says "not in range 0.000000 to 1797693...".
CLI::Validator at_least(double bound, bool inclusive);
inline CLI::Validator positive() { return at_least(0, false); }
inline CLI::Validator non_negative() { return at_least(0, true); }

// Runs the tool as `main` would, returning the exit code (tests call this directly).
int run_cli(int argc, char** argv);

}  // namespace pipetrain::apps
