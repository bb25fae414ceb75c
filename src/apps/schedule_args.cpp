// The options shared by `pipetrain schedule` and `pipetrain simulate`, and their error policy.
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "apps/schedule_commands.h"
#include "pipetrain/error.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/torch_csv.h"

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
    "usage: pipetrain schedule --kind fill-drain|1f1b|inference|interleaved|zb-h1|zb-v|dualpipev|v-half|v-min "
    "--stages P --micro-batches M [--chunks V] [--stage S] [--format text|json|csv] [--with-comm] | "
    "--from-csv FILE [--stage S] [--format text|json|csv] [--with-comm]";

void ScheduleArgs::add_to(CLI::App& command) {
  // Values are strings checked by generate(); expected(0, 1) lets a missing value reach it.
  command.add_option("--kind", kind, "fill-drain|1f1b|inference|interleaved|zb-h1|zb-v|dualpipev|v-half|v-min")
      ->type_name("KIND")
      ->expected(0, 1);
  command.add_option("--stages", stages, "pipeline stages P")->type_name("P")->expected(0, 1);
  command.add_option("--micro-batches", micro_batches, "micro-batches per step M")
      ->type_name("M")
      ->expected(0, 1);
  command
      .add_option("--chunks", chunks,
                  "model chunks per stage V (interleaved: default 2; zb-v, dualpipev, v-half, v-min: 2; "
                  "inference: "
                  "any; others: 1)")
      ->type_name("V")
      ->expected(0, 1);
  command.add_option("--stage", stage, "show this stage only")->type_name("S")->expected(0, 1);
  command.add_option("--format", format, "text (default), json or csv (torch.distributed.pipelining's)")
      ->type_name("FORMAT")
      ->expected(0, 1);
  command
      .add_option("--from-csv", from_csv,
                  "read the schedule from torch.distributed.pipelining's CSV instead of --kind")
      ->type_name("FILE")
      ->expected(0, 1);
  command.add_flag("--with-comm", with_comm, "--format csv: write sends and receives too");
  command.allow_extras();
}

schedule::Schedule ScheduleArgs::generate() const {
  if (format != "text" && format != "json" && format != "csv")
    throw ConfigError(fmt::format("--format expects text, json or csv, got '{}'", format));
  if (with_comm && format != "csv")
    throw ConfigError("--with-comm only applies to --format csv; add --format csv or drop it");
  if (!from_csv.empty()) {
    for (const auto& [option, value] : {std::pair<const char*, const std::string&>{"--kind", kind},
                                        {"--stages", stages},
                                        {"--micro-batches", micro_batches},
                                        {"--chunks", chunks}})
      if (!value.empty())
        throw ConfigError(fmt::format(
            "--from-csv takes stages, chunks, micro-batches and layout from the file: drop {} {}",
            option, value));
    schedule::Schedule s = schedule::read_torch_csv(from_csv);
    only_stage(s.num_stages());
    return s;
  }
  if (kind.empty())
    throw ConfigError(
        "--kind needs a value: fill-drain, 1f1b, inference, interleaved, zb-h1, zb-v, dualpipev, "
        "v-half or v-min (or read a schedule with --from-csv FILE)");
  const schedule::ScheduleKind k = schedule::parse_kind(kind);
  const int P = parse_int("--stages", stages, 1, "the number of pipeline stages P");
  const int M = parse_int("--micro-batches", micro_batches, 1, "the number of micro-batches M");
  schedule::ScheduleOptions options(k, P, M);
  if (!chunks.empty())
    options.chunks(parse_int("--chunks", chunks, 1, "the number of model chunks per stage V"));
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
bool ScheduleArgs::csv() const { return format == "csv"; }

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
