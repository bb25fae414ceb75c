// `pipetrain simulate`: a schedule under a cost model: makespan, bubble, memory, timelines.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/schedule_commands.h"
#include "pipetrain/error.h"
#include "pipetrain/schedule/defer_weights.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/svg.h"
#include "pipetrain/schedule/trace.h"

namespace pipetrain::apps {
namespace {

const char* const kSimulateUsage =
    "usage: pipetrain simulate --kind fill-drain|1f1b|inference|interleaved|zb-h1|zb-v|dualpipev|v-half|v-min "
    "--stages P --micro-batches M [--chunks V] | --from-csv FILE; [--stage S] [--format text|json] "
    "[--cost-forward F] [--cost-backward B] [--cost-weight W] [--cost-comm C] [--cost-send S] "
    "[--defer-weights] [--fill-waits] [--cores N [--shared-efficiency E]] [--svg FILE] [--trace FILE]";

struct SimulateArgs {
  ScheduleArgs schedule;
  std::string forward = "1", backward = "1", weight = "1", comm = "0", send = "0", cores = "0", efficiency = "1",
              svg, trace;
  bool defer_weights = false, fill_waits = false;
};

void write_file(const std::string& option, const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out)
    throw Error(
        fmt::format("{} {}: cannot write the file (check the directory exists and is "
                    "writable)",
                    option, path));
}

void print_text(const schedule::Schedule& s, const schedule::SimulationResult& r, const double costs[5],
                const schedule::CostModel& model, std::optional<int> only) {
  std::cout << fmt::format("{}: {} stages, {} micro-batches, {} chunk(s) per stage{}\n",
                           schedule::kind_name(s.kind), s.num_stages(), s.num_micro_batches,
                           s.num_chunks(),
                           s.kind == schedule::ScheduleKind::custom
                               ? fmt::format(" ({} layout)", schedule::layout_name(s.layout.kind()))
                               : "");
  std::cout << fmt::format(
      "costs per stage: forward {:g}, backward_input {:g}, backward_weight "
      "{:g} (full backward {:g}), transfer {:g}{}\n",
      costs[0], costs[1], costs[2], costs[1] + costs[2], costs[3],
      s.num_chunks() > 1
          ? fmt::format("; each of the {} chunks costs 1/{}", s.num_chunks(), s.num_chunks())
          : "");
  if (costs[4] > 0) std::cout << fmt::format("posting a send: {:g}\n", costs[4]);
  if (model.fill_waits) std::cout << "waits filled with queued weight-gradient work (the engine's executor)\n";
  if (model.cores > 0)
    std::cout << fmt::format("the ranks share {:g} cores (switching efficiency {:g})\n", model.cores,
                             model.shared_efficiency);
  std::cout << fmt::format("makespan: {:g}\n", r.makespan);
  std::cout << "stage  busy        bubble   peak live activations  buffers\n";
  for (int j = 0; j < s.num_stages(); ++j) {
    if (only && *only != j) continue;
    std::cout << fmt::format("{:<6} {:<11g} {:>6.2f}%  {:<22} {}\n", j, r.busy[j],
                             100.0 * r.bubble[j], r.peak_live_activations[j], s.buffers[j]);
  }
  std::cout << fmt::format("overall bubble: {:.2f}%\n", 100.0 * r.bubble_overall);
}

void print_json(const schedule::Schedule& s, const schedule::SimulationResult& r, const double costs[5],
                const schedule::CostModel& model, std::optional<int> only) {
  using Json = nlohmann::ordered_json;
  Json stages = Json::array();
  for (int j = 0; j < s.num_stages(); ++j) {
    if (only && *only != j) continue;
    stages.push_back({{"stage", j},
                      {"busy", r.busy[j]},
                      {"bubble", r.bubble[j]},
                      {"peak_live_activations", r.peak_live_activations[j]},
                      {"peak_activation_memory", r.peak_activation_memory[j]},
                      {"buffers", s.buffers[j]}});
  }
  const Json out = {{"kind", schedule::kind_name(s.kind)},
                    {"num_stages", s.num_stages()},
                    {"num_micro_batches", s.num_micro_batches},
                    {"num_chunks", s.num_chunks()},
                    {"costs",
                     {{"forward", costs[0]},
                      {"backward_input", costs[1]},
                      {"backward_weight", costs[2]},
                      {"transfer", costs[3]},
                      {"send", costs[4]}}},
                    {"fill_waits", model.fill_waits},
                    {"cores", model.cores},
                    {"shared_efficiency", model.shared_efficiency},
                    {"makespan", r.makespan},
                    {"bubble", r.bubble_overall},
                    {"stages", std::move(stages)}};
  std::cout << out.dump(2) << "\n";
}

}  // namespace

void add_simulate_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand(
      "simulate", "simulate a schedule under a cost model: makespan, bubble, peak memory");
  auto args = std::make_shared<SimulateArgs>();
  args->schedule.add_to(*command);
  command->add_option("--cost-forward", args->forward, "forward cost F per stage (default 1)")
      ->type_name("F")
      ->expected(0, 1);
  command
      ->add_option("--cost-backward", args->backward,
                   "input-gradient backward cost B per stage (default 1)")
      ->type_name("B")
      ->expected(0, 1);
  command
      ->add_option("--cost-weight", args->weight,
                   "weight-gradient backward cost W per stage (default 1; a full backward costs "
                   "B + W)")
      ->type_name("W")
      ->expected(0, 1);
  command->add_option("--cost-comm", args->comm, "transfer cost C between stages (default 0)")
      ->type_name("C")
      ->expected(0, 1);
  command->add_option("--cost-send", args->send, "time S a send keeps its sender (default 0)")
      ->type_name("S")
      ->expected(0, 1);
  command->add_option("--cores", args->cores,
                      "CPU cores the stages' ranks share (default 0: one each); fewer than the stages: "
                      "they take turns, the ranks with work sharing the cores equally")
      ->type_name("N")
      ->expected(0, 1);
  command->add_option("--shared-efficiency", args->efficiency,
                      "with --cores: the share of a core's time that does a rank's work while the ranks "
                      "outnumber the cores (default 1)")
      ->type_name("E")
      ->expected(0, 1);
  command->add_flag("--defer-weights", args->defer_weights,
                    "split full backwards into I and W and batch the Ws as the engine does "
                    "(schedule::defer_weight_gradients)");
  command->add_flag("--fill-waits", args->fill_waits,
                    "run queued weight-gradient work while waiting, as the engine's executor does "
                    "with its native accumulator");
  auto* svg = command->add_option("--svg", args->svg, "write the timeline as SVG")
                  ->type_name("FILE")
                  ->expected(0, 1);
  auto* trace = command->add_option("--trace", args->trace, "write a Chrome/Perfetto trace (JSON)")
                    ->type_name("FILE")
                    ->expected(0, 1);
  command->callback([command, args, svg, trace, &exit_code] {
    exit_code = run_command("simulate", kSimulateUsage, [&] {
      reject_extras(*command);
      for (const CLI::Option* file : {svg, trace})
        if (file->count() > 0 && file->as<std::string>().empty())
          throw ConfigError(file->get_name() + " needs a FILE to write");
      const double costs[5] = {parse_cost("--cost-forward", args->forward),
                               parse_cost("--cost-backward", args->backward),
                               parse_cost("--cost-weight", args->weight),
                               parse_cost("--cost-comm", args->comm),
                               parse_cost("--cost-send", args->send)};
      if (args->schedule.csv() || args->schedule.with_comm)
        throw ConfigError("simulate prints text or json; write torch's CSV with pipetrain schedule --format csv");
      schedule::Schedule s = args->schedule.generate();
      if (args->defer_weights) s = schedule::defer_weight_gradients(s);
      const auto only = args->schedule.only_stage(s.num_stages());
      auto model = schedule::CostModel::uniform(s.num_stages(), costs[0], costs[1], costs[2], costs[3]);
      model.send.assign(static_cast<size_t>(s.num_stages()), costs[4]);
      model.fill_waits = args->fill_waits;
      // Both are plain numbers like the costs, with their own ranges in the message.
      auto number = [](const char* option, const std::string& text, const char* what) {
        try {
          return parse_cost(option, text);
        } catch (const ConfigError&) {
          throw ConfigError(fmt::format("{} expects {}, got '{}'", option, what, text));
        }
      };
      model.cores = number("--cores", args->cores, "a number of cores >= 0 (0: one per stage)");
      const char* fraction = "a fraction in (0, 1]";
      model.shared_efficiency = number("--shared-efficiency", args->efficiency, fraction);
      if (model.shared_efficiency <= 0 || model.shared_efficiency > 1)
        throw ConfigError(fmt::format("--shared-efficiency expects {}, got '{}'", fraction, args->efficiency));
      const auto r = schedule::simulate(s, model);
      if (args->schedule.json())
        print_json(s, r, costs, model, only);
      else
        print_text(s, r, costs, model, only);
      if (!args->svg.empty()) {
        schedule::SvgOptions options;
        options.title = schedule::timeline_title(s, r.bubble_overall);
        options.num_rows = s.num_stages();
        write_file("--svg", args->svg, schedule::render_svg(r.events(), options));
      }
      if (!args->trace.empty())
        write_file("--trace", args->trace, schedule::render_chrome_trace(r.events()));
    });
  });
}

}  // namespace pipetrain::apps
