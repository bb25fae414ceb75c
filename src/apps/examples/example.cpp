// The example registry and what all examples share: iterators, engine config, model building.
#include "apps/examples/example.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/examples/builders.h"
#include "pipetrain/engine/pipeline_module.h"
#include "pipetrain/error.h"

namespace pipetrain::examples {

std::unique_ptr<DataIterator> Example::train_iterator(int64_t replica, int64_t first_step,
                                                      int64_t steps) const {
  const int64_t per_step = defaults.micro_batches;
  auto next = std::make_shared<int64_t>(0);
  auto data = train_micro_batch;
  return std::make_unique<FunctionIterator>([=]() -> std::optional<MicroBatch> {
    const int64_t i = (*next)++;
    const int64_t step = first_step + i / per_step;
    if (steps >= 0 && step >= first_step + steps) return std::nullopt;
    return data(step, replica, i % per_step);
  });
}

std::unique_ptr<DataIterator> Example::eval_iterator(int64_t replica) const {
  const int64_t count = eval_micro_batches(replica);
  auto next = std::make_shared<int64_t>(0);
  auto data = eval_micro_batch;
  return std::make_unique<FunctionIterator>([=]() -> std::optional<MicroBatch> {
    if (*next >= count) return std::nullopt;
    return data(replica, (*next)++);
  });
}

EngineConfig Example::engine_config() const {
  EngineConfig config;
  config.train_micro_batch_size_per_gpu = defaults.micro_batch_size;
  config.gradient_accumulation_steps = defaults.micro_batches;
  config.train_batch_size = defaults.micro_batch_size * defaults.micro_batches * replicas;
  config.gradient_clipping = defaults.gradient_clipping;
  config.seed = seed;
  config.optimizer = defaults.optimizer;
  config.scheduler = defaults.scheduler;
  config.resolve_batch_sizes(replicas);
  return config;
}

Example make_example(const std::string& name, const ExampleOptions& options) {
  if (options.replicas() < 1)
    throw ConfigError(fmt::format("replicas must be >= 1, got {}", options.replicas()));
  if (options.dropout() < 0.0 || options.dropout() >= 1.0)
    throw ConfigError(fmt::format("dropout must be in [0, 1), got {}", options.dropout()));
  if (options.dropout() > 0.0 && name != "gpt")
    throw ConfigError(fmt::format("example '{}' has no dropout setting; --dropout applies to gpt", name));
  if (name == "cnn") return detail::make_cnn(options);
  if (name == "gpt") return detail::make_gpt(options);
  if (name == "mlp") return detail::make_mlp(options);
  if (name == "resnet") return detail::make_resnet(options);
  throw ConfigError(fmt::format("unknown example '{}'; expected one of: {}", name,
                                fmt::join(example_names(), ", ")));
}

const std::vector<std::string>& example_names() {
  static const std::vector<std::string> names{"cnn", "gpt", "mlp", "resnet"};
  return names;
}

const char* default_example() { return "cnn"; }

uint64_t layer_seed(uint64_t seed, int64_t layer) { return pipetrain::layer_seed(seed, layer); }

BuiltLayers build_model(const Example& example, uint64_t seed) {
  // The engine's builder: the same per-layer seeds as every pipeline stage uses.
  return build_seeded_layers(example.layers, 0, static_cast<int64_t>(example.layers.size()), seed);
}

void set_training(BuiltLayers& model, bool training) {
  for (auto& module : model.modules) module.ptr()->train(training);
}

namespace detail {

void apply_options(const ExampleOptions& o, TrainDefaults& d) {
  auto take = [](const char* what, int64_t value, int64_t& field) {
    if (value < 0) throw ConfigError(fmt::format("{} must be >= 1, got {}", what, value));
    if (value > 0) field = value;
  };
  take("micro-batch size", o.micro_batch_size(), d.micro_batch_size);
  take("micro-batches", o.micro_batches(), d.micro_batches);
  // DeepSpeed holds train_batch_size when replicas are added: the replicas share the example's
  // step rather than each taking a whole one, so a run on D replicas trains the same model as
  // on one (the reference). Only where they divide it; otherwise each takes the default.
  if (o.micro_batches() == 0 && o.replicas() > 1 && d.micro_batches % o.replicas() == 0) {
    d.micro_batches /= o.replicas();
  }
  take("eval micro-batch size", o.eval_micro_batch_size(), d.eval_micro_batch_size);
  if (o.eval_samples() < 0)
    throw ConfigError(fmt::format("eval samples must be >= 0, got {}", o.eval_samples()));
}

}  // namespace detail
}  // namespace pipetrain::examples
