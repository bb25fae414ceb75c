// The options shared by `pipetrain schedule` and `pipetrain simulate`, and their error policy.
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "apps/schedule_commands.h"
#include "pipetrain/error.h"
#include "pipetrain/schedule/generate.h"

namespace pipetrain::apps {
namespace {

// An integer >= minimum; `what` says what the value means.
int parse_int(const std::string& option, const std::string& text, int minimum, const char* what) {
  if (text.empty())
    throw ConfigError(
        fmt::format("{} needs a value: {} (an integer >= {})", option, what, minimum));
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || value < minimum || value > 1000000000)
    throw ConfigError(
        fmt::format("{} expects {} (an integer >= {}), got '{}'", option, what, minimum, text));
  return static_cast<int>(value);
}

}  // namespace

const char* const kScheduleUsage =
    "usage: pipetrain schedule --kind fill-drain|1f1b|inference|interleaved|zb-h1|zb-v "
    "--stages P --micro-batches M [--chunks V] [--stage S] [--format text|json]";

void ScheduleArgs::add_to(CLI::App& command) {
  // Values are strings checked by generate(); expected(0, 1) lets a missing value reach it.
  command.add_option("--kind", kind, "fill-drain|1f1b|inference|interleaved|zb-h1|zb-v")
      ->type_name("KIND")
      ->expected(0, 1);
  command.add_option("--stages", stages, "pipeline stages P")->type_name("P")->expected(0, 1);
  command.add_option("--micro-batches", micro_batches, "micro-batches per step M")
      ->type_name("M")
      ->expected(0, 1);
  command
      .add_option("--chunks", chunks,
                  "model chunks per stage V (interleaved: default 2; zb-v: 2; inference: "
                  "any; others: 1)")
      ->type_name("V")
      ->expected(0, 1);
  command.add_option("--stage", stage, "show this stage only")->type_name("S")->expected(0, 1);
  command.add_option("--format", format, "text (default) or json")
      ->type_name("FORMAT")
      ->expected(0, 1);
  command.allow_extras();
}

schedule::Schedule ScheduleArgs::generate() const {
  if (kind.empty())
    throw ConfigError(
        "--kind needs a value: fill-drain, 1f1b, inference, interleaved, zb-h1 or zb-v");
  const schedule::ScheduleKind k = schedule::parse_kind(kind);
  const int P = parse_int("--stages", stages, 1, "the number of pipeline stages P");
  const int M = parse_int("--micro-batches", micro_batches, 1, "the number of micro-batches M");
  schedule::ScheduleOptions options(k, P, M);
  if (!chunks.empty())
    options.chunks(parse_int("--chunks", chunks, 1, "the number of model chunks per stage V"));
  if (format != "text" && format != "json")
    throw ConfigError(fmt::format("--format expects text or json, got '{}'", format));
  only_stage(P);
  return schedule::generate(options);
}

std::optional<int> ScheduleArgs::only_stage(int num_stages) const {
  if (stage.empty()) return std::nullopt;
  const int s = parse_int("--stage", stage, 0, "a stage index S");
  if (s >= num_stages)
    throw ConfigError(
        fmt::format("--stage {} is outside the {} stages (0..{})", s, num_stages, num_stages - 1));
  return s;
}

bool ScheduleArgs::json() const { return format == "json"; }

int run_command(const char* command, const std::string& usage, const std::function<void()>& body) {
  try {
    body();
    return 0;
  } catch (const ConfigError& e) {
    std::cerr << "pipetrain " << command << ": error: " << e.what() << "\n" << usage << "\n";
    return 2;
  } catch (const ScheduleError& e) {
    std::cerr << "pipetrain " << command << ": error: " << e.what() << "\n" << usage << "\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "pipetrain " << command << ": error: " << e.what() << "\n";
    return 1;
  }
}

void reject_extras(const CLI::App& command) {
  const auto extras = command.remaining();
  if (!extras.empty()) throw ConfigError(fmt::format("unknown argument '{}'", extras.front()));
}

double parse_cost(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double value = text.empty() ? NAN : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0)
    throw ConfigError(fmt::format("{} expects a cost (a number >= 0), got '{}'", option, text));
  return value;
}

}  // namespace pipetrain::apps
