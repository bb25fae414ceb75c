// The single-process reference trainer: all layers in one process, micro-batch accumulation.
//
// It is the baseline pipelined training is compared against: one step takes, for every
// replica r and micro-batch i, Example::train_micro_batch(step, r, i), runs it through all
// layers, and back-propagates loss / (micro-batches x replicas), so the gradient equals the
// mean over the whole data-parallel mini-batch, as the PipelineEngine's all-reduce gives it.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "apps/examples/example.h"

namespace pipetrain::examples {

struct ReferenceOptions {
  TORCH_ARG(int64_t, steps) = 0;       // 0: the example's default
  TORCH_ARG(int64_t, eval_every) = 0;  // evaluate every K steps as well as at the end; 0: end only
  TORCH_ARG(int64_t, log_every) = 0;   // 0: the config's steps_per_print
  TORCH_ARG(bool, evaluate) = true;    // the final evaluation
  TORCH_ARG(int64_t, sample_length) = 300;  // characters of the final sample (gpt); 0: none
};

struct EvalPoint {
  int64_t step = 0;  // optimizer steps done before this evaluation
  double value = 0;
};

struct ReferenceResult {
  std::vector<double> losses;  // per step: mean loss over its micro-batches and replicas
  std::vector<EvalPoint> evals;
  std::string metric_name;
  double metric = 0;  // the final evaluation (NaN when it was not run)
  int64_t steps = 0;
  int64_t samples = 0;       // rows trained on
  double train_seconds = 0;  // training steps only, without evaluation
  double total_seconds = 0;  // including data loading and evaluation
  double samples_per_second = 0;
  std::string sample;  // generated text (gpt)
};

// The example's defaults overridden by the keys present in a JSON config file (the engine's
// format): "optimizer", "scheduler", "gradient_clipping", "seed", "steps_per_print",
// "pipeline", "fp16", "bf16", "zero_optimization", "tensorboard", and the batch-size keys (which
// then replace the example's three); a key whose value is "auto" counts as absent. "" = defaults.
// `warn` says whether the parse logs its warnings (they are in the result's `warnings` either way).
EngineConfig example_config(const Example& example, const std::string& config_file = "",
                            ConfigWarnings warn = ConfigWarnings::Log);

// Where `config` (example_config of `config_file`) chose batch sizes other than `ex`'s, remakes
// `ex` with them (`options` updated), so that its data gives the engine the micro-batches the
// config asks for. ConfigError when the command line chose them too (`command_line_sets`).
void match_config_batches(Example& ex, ExampleOptions& options, const EngineConfig& config,
                          const std::string& config_file, bool command_line_sets);

// The metric over every replica's evaluation shard, in evaluation mode without gradients
// (restores training mode).
MetricSum evaluate(const Example& example, BuiltLayers& model);

// Trains a model built with build_model(example, config.seed) for `options.steps()` steps and
// evaluates it. The micro-batch size and count come from `example` (ExampleOptions); `config`
// gives the optimizer, learning-rate schedule, clipping and seed, and must agree with the
// example's batch sizes (ConfigError otherwise). Progress lines go to `log` (may be null).
// NumericError when a loss is not finite.
ReferenceResult train_reference(const Example& example, const EngineConfig& config,
                                const ReferenceOptions& options, std::ostream* log = nullptr,
                                BuiltLayers* model_out = nullptr);

}  // namespace pipetrain::examples
