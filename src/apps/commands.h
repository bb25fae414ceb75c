// The subcommands of the `pipetrain` tool; each file in src/apps adds one.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace pipetrain::apps {

// Each add_*_command registers a subcommand on `app`; the callback it installs runs the
// command and stores the process exit code in `exit_code`.
using CommandAdder = void (*)(CLI::App& app, int& exit_code);

// Builds the whole command-line interface.
void add_all_commands(CLI::App& app, int& exit_code);

// Runs the tool as `main` would, returning the exit code (tests call this directly).
int run_cli(int argc, char** argv);

}  // namespace pipetrain::apps
