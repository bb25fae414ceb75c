// The single-process reference trainer: all layers in one process, micro-batch accumulation.
#include "apps/examples/reference_trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "pipetrain/engine/optimizer.h"
#include "pipetrain/error.h"

namespace pipetrain::examples {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

EngineConfig example_config(const Example& example, const std::string& config_file, ConfigWarnings warn) {
  EngineConfig config = example.engine_config();
  if (config_file.empty()) return config;
  std::ifstream in(config_file);
  if (!in) throw ConfigError("cannot read config file " + config_file + "; check the path");
  std::stringstream text;
  text << in.rdbuf();
  const EngineConfig file = EngineConfig::from_json_text(text.str(), config_file, warn);
  const auto keys = nlohmann::json::parse(text.str());  // valid: from_json_text accepted it
  // "auto" (HF Trainer's) leaves the example's value, as an absent key does.
  auto has = [&](const char* key) {
    return keys.contains(key) && !keys[key].is_null() && keys[key] != "auto";
  };
  if (has("optimizer")) config.optimizer = file.optimizer;
  if (has("scheduler")) config.scheduler = file.scheduler;
  if (has("gradient_clipping")) config.gradient_clipping = file.gradient_clipping;
  if (has("seed")) config.seed = file.seed;
  if (has("steps_per_print")) config.steps_per_print = file.steps_per_print;
  if (has("wall_clock_breakdown")) config.wall_clock_breakdown = file.wall_clock_breakdown;
  if (has("pipeline")) config.pipeline = file.pipeline;
  if (has("fp16")) config.fp16 = file.fp16;
  if (has("bf16") || has("bfloat16")) config.bf16 = file.bf16;
  if (has("zero_optimization")) config.zero_optimization = file.zero_optimization;
  if (has("tensorboard")) config.tensorboard = file.tensorboard;
  if (has("train_batch_size") || has("train_micro_batch_size_per_gpu") ||
      has("gradient_accumulation_steps")) {
    config.train_batch_size = file.train_batch_size;
    config.train_micro_batch_size_per_gpu = file.train_micro_batch_size_per_gpu;
    config.gradient_accumulation_steps = file.gradient_accumulation_steps;
    config.resolve_batch_sizes(example.replicas);
  }
  config.warnings = file.warnings;
  return config;
}

void match_config_batches(Example& ex, ExampleOptions& options, const EngineConfig& config,
                          const std::string& config_file, bool command_line_sets) {
  if (config.train_micro_batch_size_per_gpu == ex.defaults.micro_batch_size &&
      config.gradient_accumulation_steps == ex.defaults.micro_batches)
    return;
  if (command_line_sets)
    throw ConfigError(fmt::format(
        "{} sets {} micro-batches of {} rows, the command line {} of {}; give them in one place",
        config_file, config.gradient_accumulation_steps, config.train_micro_batch_size_per_gpu,
        ex.defaults.micro_batches, ex.defaults.micro_batch_size));
  options.micro_batch_size(config.train_micro_batch_size_per_gpu).micro_batches(config.gradient_accumulation_steps);
  ex = make_example(ex.name, options);
}

MetricSum evaluate(const Example& example, BuiltLayers& model) {
  const bool was_training = !model.modules.empty() && model.modules.front().ptr()->is_training();
  set_training(model, false);
  torch::NoGradGuard no_grad;
  MetricSum total;
  for (int64_t r = 0; r < example.replicas; ++r) {
    const int64_t n = example.eval_micro_batches(r);
    for (int64_t i = 0; i < n; ++i) {
      const MicroBatch mb = example.eval_micro_batch(r, i);
      total += example.metric.measure(model.forward(mb.inputs), mb.labels);
    }
  }
  set_training(model, was_training);
  return total;
}

ReferenceResult train_reference(const Example& example, const EngineConfig& config,
                                const ReferenceOptions& options, std::ostream* log,
                                BuiltLayers* model_out) {
  const auto start = Clock::now();
  const int64_t M = example.defaults.micro_batches, B = example.defaults.micro_batch_size,
                D = example.replicas;
  if (config.train_micro_batch_size_per_gpu != B || config.gradient_accumulation_steps != M)
    throw ConfigError(fmt::format(
        "the config's batch sizes (micro-batch {} x {} accumulation steps) differ from the "
        "example's data (micro-batch {} x {} micro-batches); pass them as example options",
        config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps, B, M));
  if (options.steps() < 0)
    throw ConfigError(fmt::format("steps must be >= 1, got {}", options.steps()));
  const int64_t steps = options.steps() > 0 ? options.steps() : example.defaults.steps;
  const int64_t log_every = options.log_every() > 0 ? options.log_every() : config.steps_per_print;

  BuiltLayers model = build_model(example, config.seed);
  set_training(model, true);
  auto optimizer = make_optimizer(config.optimizer, model.parameters());
  const auto params = model.parameters();

  ReferenceResult result;
  result.metric_name = example.metric.name;
  result.metric = std::nan("");
  double train_seconds = 0;
  auto run_eval = [&](int64_t step) {
    const double value = evaluate(example, model).value();
    result.evals.push_back({step, value});
    if (log)
      *log << fmt::format("eval  step {:>5}  {} {:.4f}\n", step, example.metric.name, value)
           << std::flush;
    return value;
  };

  for (int64_t step = 0; step < steps; ++step) {
    const auto step_start = Clock::now();
    const double lr = config.scheduler.lr_at(step, config.optimizer.lr);
    set_learning_rate(*optimizer, lr);
    optimizer->zero_grad();
    double loss_sum = 0;
    for (int64_t r = 0; r < D; ++r) {
      for (int64_t i = 0; i < M; ++i) {
        const MicroBatch mb = example.train_micro_batch(step, r, i);
        const torch::Tensor loss = example.loss(model.forward(mb.inputs), mb.labels);
        const double value = loss.item<double>();
        if (!std::isfinite(value))
          throw NumericError(fmt::format(
              "step {}, replica {}, micro-batch {}: the loss is {}; lower the learning rate "
              "(now {:g}) or enable gradient_clipping",
              step, r, i, value, lr));
        loss_sum += value;
        (loss / static_cast<double>(M * D)).backward();
      }
    }
    if (config.gradient_clipping > 0)
      torch::nn::utils::clip_grad_norm_(params, config.gradient_clipping);
    optimizer->step();
    train_seconds += seconds_since(step_start);
    result.losses.push_back(loss_sum / static_cast<double>(M * D));
    result.samples += M * B * D;
    if (log && ((step + 1) % log_every == 0 || step == 0 || step + 1 == steps))
      *log << fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  {:.0f} samples/s\n", step + 1,
                          steps, result.losses.back(), lr, result.samples / train_seconds)
           << std::flush;  // progress, also when the output is a pipe
    if (options.eval_every() > 0 && (step + 1) % options.eval_every() == 0 && step + 1 < steps)
      run_eval(step + 1);
  }
  result.steps = steps;
  result.train_seconds = train_seconds;
  result.samples_per_second = train_seconds > 0 ? result.samples / train_seconds : 0;
  if (options.evaluate()) result.metric = run_eval(steps);
  if (example.sample && options.sample_length() > 0)
    result.sample =
        example.sample(model, SampleOptions().length(options.sample_length()).seed(config.seed));
  result.total_seconds = seconds_since(start);
  if (model_out) *model_out = std::move(model);
  return result;
}

}  // namespace pipetrain::examples
