// `pipetrain balance`: the automatic balance of a workload or example over P stages, with each
// stage's cost, from the partition layer's profilers and its exact min-max partitioner.
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "apps/bench/mlp_workload.h"
#include "apps/commands.h"
#include "apps/examples/example.h"
#include "pipetrain/error.h"
#include "pipetrain/partition/balance.h"

namespace pipetrain::apps {
namespace {

using nlohmann::json;

struct BalanceArgs {
  std::string workload;  // "mlp" / "mlp-4" (WORKLOADS.md)
  std::string example;   // or an example: cnn, gpt, mlp, resnet
  int stages = 0;        // 0: the workload's or example's default
  std::string by = "time";
  int budget_ms = 2000;
  bool json_only = false;
};

// The model as one Sequential, a sample micro-batch, its parameter costs and default stages.
struct Subject {
  std::string name;
  torch::nn::Sequential model;
  std::vector<std::string> types;
  Batch sample;
  std::vector<double> params;
  int default_stages = 2;
};

Subject workload_subject(const std::string& name) {
  const auto w = make_mlp_workload(name);
  Subject s;
  s.name = name;
  s.model = mlp_sequential(w);
  for (const auto& layer : *s.model) s.types.push_back(short_type_name(*layer.ptr()));
  s.sample = Batch(w.x.narrow(0, 0, MlpWorkload::kRows / w.micro_batches));
  s.params = parameter_costs(s.model);
  s.default_stages = w.stages;
  return s;
}

Subject example_subject(const std::string& name) {
  const auto ex = examples::make_example(name);
  auto built = examples::build_model(ex, ex.seed);
  Subject s;
  s.name = name;
  for (size_t i = 0; i < built.modules.size(); ++i) {
    s.model->push_back(std::to_string(i), built.modules[i]);
    s.types.push_back(built.specs[i].type);
  }
  s.sample = ex.train_micro_batch(0, 0, 0).inputs;
  s.params = parameter_costs(ex.layers);  // a tied module counts once
  s.default_stages = static_cast<int>(ex.defaults.pipeline_stages);
  return s;
}

std::string format_cost(double cost, const std::string& by) {
  if (by == "time") return fmt::format("{:.3f} ms", cost * 1e3);
  if (by == "size") return fmt::format("{:.2f} MiB", cost / (1 << 20));
  if (by == "params") return fmt::format("{:.0f} parameters", cost);
  return fmt::format("{:.0f} layers", cost);
}

int run_balance(const BalanceArgs& a) {
  if (a.workload.empty() == a.example.empty()) {
    throw ConfigError("give exactly one of --workload (mlp, mlp-4) and --example (cnn, gpt, mlp, resnet)");
  }
  Subject s = a.workload.empty() ? example_subject(a.example) : workload_subject(a.workload);
  const int64_t stages = a.stages > 0 ? a.stages : s.default_stages;
  const auto layers = static_cast<int64_t>(s.types.size());
  if (stages > layers) {
    throw ConfigError(fmt::format("--stages {} exceeds the {} layers of {}; use at most {} stages", stages, layers,
                                  s.name, layers));
  }
  std::vector<double> costs;
  s.model->train();
  if (a.by == "time") {
    TimeProfileOptions options;
    options.budget = std::chrono::milliseconds(a.budget_ms);
    costs = time_costs(s.model, s.sample, options);
  } else if (a.by == "size") {
    costs = size_costs(s.model, s.sample);
  } else if (a.by == "params") {
    costs = s.params;
  } else {
    costs.assign(static_cast<size_t>(layers), 1.0);
  }
  const auto balance = min_max_partition(costs, stages);
  const auto per_stage = stage_costs(costs, balance);
  const double total = std::accumulate(per_stage.begin(), per_stage.end(), 0.0);
  const double worst = *std::max_element(per_stage.begin(), per_stage.end());
  if (!a.json_only) {
    std::cout << fmt::format("{}: {} layers over {} stages, balanced by {}{}\n", s.name, layers, stages, a.by,
                             a.by == "time" ? fmt::format(" (forward + backward of a {}-row micro-batch)",
                                                          s.sample.tensor().size(0))
                                            : "");
    int64_t first = 0;
    for (size_t j = 0; j < balance.size(); ++j) {
      std::cout << fmt::format("  stage {}: layers {:>3}-{:<3} ({:>2}, {}..{})  {:>16}  {:5.1f}%\n", j, first,
                               first + balance[j] - 1, balance[j], s.types[static_cast<size_t>(first)],
                               s.types[static_cast<size_t>(first + balance[j] - 1)],
                               format_cost(per_stage[j], a.by), total > 0 ? 100.0 * per_stage[j] / total : 0.0);
      first += balance[j];
    }
    std::cout << fmt::format("slowest stage / mean stage: {:.3f}\n",
                             total > 0 ? worst / (total / static_cast<double>(stages)) : 1.0);
  }
  json out = {{"subject", s.name},     {"by", a.by},          {"stages", stages},
              {"balance", balance},    {"stage_costs", per_stage}, {"layer_costs", costs},
              {"unit", a.by == "time" ? "s" : a.by == "size" ? "bytes" : a.by == "params" ? "parameters" : "layers"}};
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace

void add_balance_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BalanceArgs>();
  CLI::App* sub = app.add_subcommand(
      "balance",
      "the automatic balance of a model over pipeline stages (exact min-max split of per-layer "
      "costs) and each stage's cost; the last line is one JSON object");
  sub->add_option("--workload", args->workload, "a benchmark workload: mlp or mlp-4")
      ->check(CLI::IsMember({"mlp", "mlp-4"}));
  sub->add_option("--example", args->example, "or an example model: cnn, gpt, mlp or resnet")
      ->check(CLI::IsMember(examples::example_names()));
  sub->add_option("--stages", args->stages, "pipeline stages (default: the workload's or example's)")
      ->check(positive());
  sub->add_option("--by", args->by,
                  "time (profiled forward + backward per layer), size (parameter and activation "
                  "bytes), params, or uniform")
      ->check(CLI::IsMember({"time", "size", "params", "uniform"}))
      ->capture_default_str();
  sub->add_option("--budget-ms", args->budget_ms, "profiling time for --by time")
      ->check(positive())
      ->capture_default_str();
  sub->add_flag("--json", args->json_only, "print only the JSON line");
  sub->callback([args, &exit_code] { exit_code = run_balance(*args); });
}

}  // namespace pipetrain::apps
