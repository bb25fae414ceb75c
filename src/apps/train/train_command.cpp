// `pipetrain train`: trains an example across local processes (one per stage and replica),
// then prints a summary and writes the run directory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/examples/example.h"
#include "apps/train/default_split.h"
#include "apps/train/run_files.h"
#include "apps/train/train_args.h"
#include "apps/train/train_monitor.h"
#include "apps/train/train_worker.h"
#include "pipetrain/comm/launcher.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/engine/pipeline_module.h"
#include "pipetrain/error.h"
#include "pipetrain/util/blas.h"

namespace pipetrain::apps {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string default_run_dir(const std::string& example) {
  const auto t = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  return (fs::path("runs") / (example + "-" + stamp)).string();
}

void print_summary(const json& s) {
  const std::string metric = s.value("metric", "");
  std::cout << "\n== summary: " << s["example"].get<std::string>() << " ==\n";
  std::cout << fmt::format("final loss        {:.4f}\n", s["final_loss"].get<double>());
  if (!metric.empty() && s.contains(metric) && s[metric].is_number()) {
    const double v = s[metric].get<double>();
    std::cout << (metric == "accuracy" ? fmt::format("test accuracy     {:.2f}%\n", 100 * v)
                                       : fmt::format("{:<17} {:.4f}\n", metric, v));
  }
  std::cout << fmt::format("wall time         {:.1f} s ({:.1f} s training)\n", s["wall_seconds"].get<double>(),
                           s["train_seconds"].get<double>());
  std::cout << fmt::format("throughput        {:.1f} samples/s\n", s["samples_per_s"].get<double>());
  const int tensor = s.value("tensor_parallel", 1);
  std::cout << fmt::format("pipeline          {} stages x {} replicas{}, {} x {} micro-batches, {}\n",
                           s["stages"].get<int>(), s["replicas"].get<int>(),
                           tensor > 1 ? fmt::format(" x {} tensor-parallel", tensor) : "", s["micro_batches"].get<int>(),
                           s["micro_batch_size"].get<int>(), s["schedule"].get<std::string>());
  if (s.contains("split")) std::cout << "split             " << s["split"].get<std::string>() << "\n";
  std::cout << fmt::format("bubble            {:.1f}% measured, {:.1f}% simulated\n",
                           100 * s["bubble_measured"].get<double>(), 100 * s["bubble_simulated"].get<double>());
  for (const auto& r : s["ranks"]) {
    std::cout << fmt::format("peak memory       stage {} replica {}{}: {:.0f} MiB\n", r["stage"].get<int>(),
                             r["replica"].get<int>(),
                             tensor > 1 ? fmt::format(" tensor {}", r.value("tensor", 0)) : "",
                             r["peak_memory_mb"].get<double>());
  }
  if (s.contains("sample")) std::cout << "sample:\n" << s["sample"].get<std::string>() << "\n";
  std::cout << "run directory     " << s["run_dir"].get<std::string>()
            << " (metrics.jsonl, loss.svg, timeline.svg, trace.json, checkpoint/, summary.json)\n";
  std::cout << "tensorboard       " << s["tensorboard"].get<std::string>() << "\n";
}

// The layout against the model and the machine, before a process starts: each stage needs a
// layer, and the launcher's per-core limit is checked here too so the error names the layout.
void check_layout(int stages, int layers, int nproc, const TrainArgs& args) {
  if (stages > layers) {
    throw ConfigError(fmt::format("--stages {} is more than the example's {} layers; give at most --stages {}", stages,
                                  layers, layers));
  }
  comm::LaunchOptions probe;
  probe.nproc(nproc).oversubscribe(args.oversubscribe);
  try {
    probe.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{} stages x {} replicas x {} tensor-parallel: {}", stages, args.replicas,
                                  nproc / std::max(1, stages * args.replicas), e.what()));
  }
}

int run_train(TrainArgs args) {
  if (args.worker) return run_train_worker(args);
  // Checks the example, its data files and the config here, with one clear error, before any
  // process starts.
  const auto ex = make_train_example(args);
  const auto config = make_train_config(args, ex);
  const int stages = static_cast<int>(config.pipeline.stages);
  const int tensor = static_cast<int>(config.tensor_parallel.size);
  const int nproc = stages * args.replicas * tensor;
  check_layout(stages, static_cast<int>(ex.layers.size()), nproc, args);
  if (!args.balance.empty()) {
    int64_t sum = 0;
    for (int64_t n : args.balance) sum += n;
    if (sum != static_cast<int64_t>(ex.layers.size()))
      throw ConfigError(fmt::format("--balance {} sums to {} layers; example {} has {}: give counts that sum to {}",
                                    fmt::join(args.balance, ","), sum, ex.name, ex.layers.size(), ex.layers.size()));
  }
  // The split is chosen here, once, and given to every rank on its command line.
  const std::string split = choose_train_split(args, ex, config, nproc);
  if (args.run_dir.empty()) args.run_dir = default_run_dir(args.example);
  args.run_dir = fs::absolute(args.run_dir).string();
  if (args.resume && checkpoint_step((fs::path(args.run_dir) / "checkpoint").string()) < 0) {
    throw UsageError("--resume: no checkpoint in " + args.run_dir + "/checkpoint; start without --resume");
  }
  fs::create_directories(args.run_dir);
  make_tensorboard_dir(config.tensorboard, args.run_dir);  // an unwritable output_path fails here, once
  std::cout << fmt::format("pipetrain train: example {} ({}), {} stages x {} replicas{} as {} processes\n", ex.name,
                           ex.description, stages, args.replicas,
                           tensor > 1 ? fmt::format(" x {} tensor-parallel", tensor) : "", nproc)
            << util::describe_blas(util::blas_info()) << "\n" << split << "\nrun directory: " << args.run_dir
            << std::endl;

  std::vector<std::string> command{fs::read_symlink("/proc/self/exe").string()};
  const auto worker = args.worker_arguments();
  command.insert(command.end(), worker.begin(), worker.end());
  comm::LaunchOptions options;
  options.nproc(nproc).threads_per_rank(args.threads_per_rank).oversubscribe(args.oversubscribe);
  if (args.time_limit > 0) options.time_limit(std::chrono::milliseconds(static_cast<int64_t>(args.time_limit * 1000)));
  const auto launched = comm::launch_with_restarts(command, options, args.max_restarts, [&](const auto& failed, int n) {
    std::cout << fmt::format("pipetrain train: {}; restarting all processes ({} of {}), resuming from {}\n",
                             failed.message, n, args.max_restarts, (fs::path(args.run_dir) / "checkpoint").string())
              << std::flush;
  });
  if (launched.exit_code != 0) {
    std::cerr << "pipetrain train: " << launched.message << "\n";
    return launched.exit_code;
  }

  const fs::path dir(args.run_dir);
  std::ifstream in(dir / "summary.json");
  if (!in) throw Error("the ranks finished but wrote no " + (dir / "summary.json").string());
  json summary = json::parse(in);
  summary["split"] = split;
  write_loss_curve(dir / "metrics.jsonl", dir / "loss.svg", ex.name, ex.metric.name);
  if (ex.sample && args.sample_length > 0) {
    // Generation runs in this process, on the whole model loaded from the per-layer checkpoint.
    auto model = build_seeded_layers(ex.layers, 0, static_cast<int64_t>(ex.layers.size()), config.seed);
    load_checkpoint(model, (dir / "checkpoint").string());
    summary["sample"] = ex.sample(model, examples::SampleOptions().length(args.sample_length));
  }
  // A sample from a barely trained model may hold bytes that are not UTF-8.
  const auto replace = json::error_handler_t::replace;
  std::ofstream(dir / "summary.json") << summary.dump(2, ' ', false, replace) << "\n";
  print_summary(summary);
  std::cout << summary.dump(-1, ' ', false, replace) << std::endl;
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand(
      "train",
      "train an example model with a pipeline of local processes (one per stage and replica).\n"
      "  pipetrain train                                  # cnn on Fashion-MNIST, 2 stages\n"
      "  pipetrain train --example gpt --steps 300        # char-level GPT on fortunes\n"
      "  pipetrain train --stages 4 --schedule zb-h1 --micro-batches 8\n"
      "  pipetrain train --run-dir runs/a --resume --stages 3   # continue with another layout");
  add_train_options(*sub, args);
  sub->callback([args, sub, &exit_code] {
    TrainArgs a = *args;
    if (!a.plan.empty() && !a.balance.empty())
      throw UsageError("--balance and --plan both give the split; drop --balance to train the plan's, or --plan");
    if (!a.worker && !a.plan.empty()) {
      apply_plan_file(a, sub->get_option("--example")->count() > 0);
      a.plan = fs::absolute(a.plan).string();  // the ranks may start elsewhere
    }
    exit_code = run_train(std::move(a));
  });
}

}  // namespace pipetrain::apps
