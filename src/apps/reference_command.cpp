// `pipetrain reference`: train an example in one process (all layers, no pipeline), the
// baseline pipelined runs are compared against.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/examples/example.h"
#include "apps/examples/reference_trainer.h"
#include "apps/schedule_commands.h"
#include "pipetrain/error.h"
#include "pipetrain/util/blas.h"

namespace pipetrain::apps {
namespace {

const char* const kReferenceUsage =
    "usage: pipetrain reference [--example cnn|gpt|mlp|resnet] [--steps N | --epochs E] "
    "[--micro-batches M] [--micro-batch-size B] [--replicas D] [--config FILE] [--lr LR] "
    "[--seed S] [--eval-every K] [--log-every K] [--eval-samples N] [--sample-length N] "
    "[--threads T] [--data-dir DIR]";

struct ReferenceArgs {
  std::string example = examples::default_example();
  std::string steps, epochs, micro_batches, micro_batch_size, replicas, config, lr, seed,
      eval_every, log_every, eval_samples, sample_length, threads, data_dir, dropout;
};

// An integer >= minimum, or `fallback` when the option was not given.
int64_t parse_int(const std::string& option, const std::string& text, int64_t minimum,
                  int64_t fallback = 0) {
  if (text.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || value < minimum)
    throw ConfigError(fmt::format("{} expects an integer >= {}, got '{}'", option, minimum, text));
  return value;
}

double parse_positive(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value <= 0)
    throw ConfigError(fmt::format("{} expects a number > 0, got '{}'", option, text));
  return value;
}

double parse_probability(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(value >= 0 && value < 1))
    throw ConfigError(fmt::format("{} expects a probability in [0, 1), got '{}'", option, text));
  return value;
}

void run_reference(const ReferenceArgs& a) {
  if (a.example.empty()) throw ConfigError("--example needs a value: cnn, gpt, mlp or resnet");
  const auto& names = examples::example_names();
  if (std::find(names.begin(), names.end(), a.example) == names.end())
    throw ConfigError(fmt::format("--example expects one of {}, got '{}'", fmt::join(names, ", "),
                                  a.example.empty() ? "" : a.example));
  if (!a.steps.empty() && !a.epochs.empty())
    throw ConfigError("--steps and --epochs are alternatives; give one of them");
  const int64_t threads = parse_int("--threads", a.threads, 1);
  if (threads > 0) torch::set_num_threads(static_cast<int>(threads));

  examples::ExampleOptions options;
  options.micro_batches(parse_int("--micro-batches", a.micro_batches, 1))
      .micro_batch_size(parse_int("--micro-batch-size", a.micro_batch_size, 1))
      .replicas(parse_int("--replicas", a.replicas, 1, 1))
      .eval_samples(parse_int("--eval-samples", a.eval_samples, 1))
      .data_dir(a.data_dir);
  if (!a.seed.empty()) options.seed(static_cast<uint64_t>(parse_int("--seed", a.seed, 0)));
  if (!a.dropout.empty()) options.dropout(parse_probability("--dropout", a.dropout));
  const int64_t steps_arg = parse_int("--steps", a.steps, 1);
  const int64_t epochs = parse_int("--epochs", a.epochs, 1);
  const int64_t eval_every = parse_int("--eval-every", a.eval_every, 1);
  const int64_t log_every = parse_int("--log-every", a.log_every, 1);
  const int64_t sample_length = parse_int("--sample-length", a.sample_length, 0, 300);
  const double lr = a.lr.empty() ? 0 : parse_positive("--lr", a.lr);

  examples::Example ex = examples::make_example(a.example, options);
  EngineConfig config = examples::example_config(ex, a.config);
  // The config file chose the batch sizes: make the data to match.
  examples::match_config_batches(ex, options, config, a.config, !a.micro_batches.empty() || !a.micro_batch_size.empty());
  if (!a.seed.empty()) config.seed = options.seed();
  if (lr > 0) {
    config.optimizer.lr = lr;
    if (!config.scheduler.type.empty()) config.scheduler.warmup_max_lr = lr;
  }
  int64_t steps = steps_arg;
  if (epochs > 0) {
    if (ex.steps_per_epoch == 0)
      throw ConfigError(
          fmt::format("--epochs: the {} example's data has no epochs; use --steps", ex.name));
    steps = epochs * ex.steps_per_epoch;
  }

  const auto blas = util::blas_info();
  std::cout << fmt::format("reference: example {} ({}), {} layers, 1 process, {} thread(s)\n",
                           ex.name, ex.description, ex.layers.size(), torch::get_num_threads())
            << fmt::format(
                   "reference: {} replica(s) x {} micro-batches x {} rows per step, {} "
                   "steps, optimizer {} lr {:g}\n",
                   ex.replicas, ex.defaults.micro_batches, ex.defaults.micro_batch_size,
                   steps > 0 ? steps : ex.defaults.steps, config.optimizer.type,
                   config.optimizer.lr)
            << util::describe_blas(blas) << "\n";
  if (const auto warning = util::blas_warning(blas); !warning.empty()) std::cerr << warning << "\n";

  const auto result = examples::train_reference(ex, config,
                                                examples::ReferenceOptions()
                                                    .steps(steps)
                                                    .eval_every(eval_every)
                                                    .log_every(log_every)
                                                    .sample_length(sample_length),
                                                &std::cout);
  if (!result.sample.empty()) std::cout << "sample:\n" << result.sample << "\n";
  std::cout << fmt::format(
      "final: loss {:.4f}, {} {:.4f}, {} steps, {} samples in {:.1f} s of training ({:.1f} s in "
      "all), {:.0f} samples/s\n",
      result.losses.empty() ? 0.0 : result.losses.back(), result.metric_name, result.metric,
      result.steps, result.samples, result.train_seconds, result.total_seconds,
      result.samples_per_second);
  nlohmann::json summary = {{"example", ex.name},
                            {"steps", result.steps},
                            {"final_loss", result.losses.empty() ? 0.0 : result.losses.back()},
                            {"metric", result.metric_name},
                            {result.metric_name, result.metric},
                            {"samples", result.samples},
                            {"train_seconds", result.train_seconds},
                            {"total_seconds", result.total_seconds},
                            {"samples_per_second", result.samples_per_second}};
  std::cout << summary.dump() << "\n";
}

}  // namespace

void add_reference_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand(
      "reference",
      "train an example in one process (all layers, micro-batch gradient accumulation): the "
      "baseline pipelined training is compared against");
  auto a = std::make_shared<ReferenceArgs>();
  auto opt = [&](const char* name, std::string& value, const char* type, const char* help) {
    command->add_option(name, value, help)->type_name(type)->expected(0, 1);
  };
  opt("--example", a->example, "NAME",
      "cnn (default): Fashion-MNIST conv net; gpt: char-level GPT on fortunes; mlp: the benchmark "
      "workload");
  opt("--steps", a->steps, "N", "optimizer steps (default: the example's)");
  opt("--epochs", a->epochs, "E", "passes over the training set instead of --steps (cnn)");
  opt("--micro-batches", a->micro_batches, "M", "micro-batches per step (gradient accumulation)");
  opt("--micro-batch-size", a->micro_batch_size, "B", "rows per micro-batch");
  opt("--replicas", a->replicas, "D",
      "data-parallel replicas simulated in this process (default 1)");
  opt("--config", a->config, "FILE",
      "engine JSON config; its keys override the example's defaults");
  opt("--lr", a->lr, "LR", "learning rate");
  opt("--seed", a->seed, "S", "seed of the weights and the data order (default 1234)");
  opt("--eval-every", a->eval_every, "K", "also evaluate every K steps");
  opt("--log-every", a->log_every, "K",
      "print the loss every K steps (default: steps_per_print, 10)");
  opt("--eval-samples", a->eval_samples, "N", "evaluate on the first N samples (windows for gpt)");
  opt("--dropout", a->dropout, "P", "dropout probability (gpt: GPT-2's attention, residual and embedding dropout)");
  opt("--sample-length", a->sample_length, "N",
      "characters of generated text at the end (gpt; 0: none)");
  opt("--threads", a->threads, "T", "intra-op threads (default: LibTorch's)");
  opt("--data-dir", a->data_dir, "DIR", "the data set's directory (default: the Debian package's)");
  command->allow_extras();
  command->footer(
      "Examples:\n"
      "  pipetrain reference                                  # cnn, 2 epochs\n"
      "  pipetrain reference --example gpt --steps 200\n"
      "  pipetrain reference --example mlp --steps 3 --micro-batches 8\n");
  command->callback([command, a, &exit_code] {
    exit_code = run_command("reference", kReferenceUsage, [&] {
      reject_extras(*command);
      run_reference(*a);
    });
  });
}

}  // namespace pipetrain::apps
