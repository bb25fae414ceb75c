// The `pipetrain` command line: global flags, subcommand dispatch and error reporting.
#include <iostream>
#include <stdexcept>
#include <string>

#include "apps/commands.h"
#include "apps/schedule_commands.h"
#include "pipetrain/error.h"
#include "pipetrain/util/blas.h"
#include "pipetrain/util/malloc_tuning.h"
#include "pipetrain/version.h"

namespace pipetrain::apps {

void add_launch_command(CLI::App& app, int& exit_code);     // launch_command.cpp
void add_reference_command(CLI::App& app, int& exit_code);  // reference_command.cpp
void add_bench_command(CLI::App& app, int& exit_code);      // bench/bench_command.cpp
void add_train_command(CLI::App& app, int& exit_code);      // train/train_command.cpp
void add_balance_command(CLI::App& app, int& exit_code);    // balance_command.cpp
void add_plan_command(CLI::App& app, int& exit_code);       // plan/plan_command.cpp

CLI::Validator at_least(double bound, bool inclusive) {
  const std::string relation = inclusive ? ">= " : "> ";
  const std::string shown = std::to_string(static_cast<long long>(bound));
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        try {
          size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) throw std::invalid_argument(text);
        } catch (const std::exception&) {
          return "must be a number " + relation + shown + ", got '" + text + "'";
        }
        if (inclusive ? value >= bound : value > bound) return "";
        return "must be " + relation + shown + ", got " + text;
      },
      inclusive ? "NUMBER>=" + shown : "NUMBER>" + shown);
}

void add_all_commands(CLI::App& app, int& exit_code) {
  add_schedule_command(app, exit_code);
  add_simulate_command(app, exit_code);
  add_launch_command(app, exit_code);
  add_train_command(app, exit_code);
  add_reference_command(app, exit_code);
  add_bench_command(app, exit_code);
  add_balance_command(app, exit_code);
  add_plan_command(app, exit_code);
}

int run_cli(int argc, char** argv) {
  util::tune_malloc_for_training();  // before any tensor: see malloc_tuning.h
  CLI::App app{"pipetrain: pipeline-parallel training for LibTorch", "pipetrain"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "print the version and the active BLAS library, then exit");
  int exit_code = 0;
  add_all_commands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version-like exits, and errors outside a subcommand: CLI11's own output.
    CLI::App* sub = nullptr;
    if (argc > 1 && e.get_exit_code() != 0) {
      for (auto* candidate : app.get_subcommands({})) {
        if (candidate->get_name() == argv[1]) sub = candidate;
      }
    }
    if (!sub) return app.exit(e);
    // The commands' convention (run_command): one line saying what is wrong, then the usage.
    std::cerr << "pipetrain " << sub->get_name() << ": error: " << e.what() << "\n" << sub->help();
    return 2;
  } catch (const pipetrain::Error& e) {
    std::cerr << "pipetrain: " << e.what() << "\n";
    return exit_code != 0 ? exit_code : 1;
  }
  if (version) {
    const auto info = util::blas_info();
    std::cout << "pipetrain " << PIPETRAIN_VERSION << "\n" << util::describe_blas(info) << "\n";
    const auto warning = util::blas_warning(info);
    if (!warning.empty()) std::cerr << warning << "\n";
    return 0;
  }
  if (app.get_subcommands().empty()) {
    std::cout << app.help();
    return 0;
  }
  return exit_code;
}

}  // namespace pipetrain::apps
