// Automatic balancing: per-layer costs (time, size, parameters, type) and the balances the
// min-max partitioner builds from them.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/partition/layer_spec.h"
#include "pipetrain/partition/min_max.h"

namespace pipetrain {

// Layers split as evenly as counts allow; earlier stages take the remainder.
std::vector<int64_t> balance_uniform(int64_t layers, int64_t parts);

// Number of parameter elements of each layer.
std::vector<double> parameter_costs(const torch::nn::Sequential& model);
// Builds each spec once (tied specs count once, at their first use) to count its parameters.
std::vector<double> parameter_costs(const std::vector<LayerSpec>& specs);

// 1 for each layer whose type (LayerSpec::type, or the module's class name without its
// namespace) matches `pattern` (ECMAScript regex, case-insensitive, searched anywhere), else 0.
// ConfigError when the pattern is invalid or matches no layer.
std::vector<double> type_costs(const std::vector<LayerSpec>& specs, const std::string& pattern);
std::vector<double> type_costs(const torch::nn::Sequential& model, const std::string& pattern);

struct TimeProfileOptions {
  std::chrono::milliseconds budget{1000};  // total profiling time to spend (at least one pass)
  int64_t min_passes = 2;                  // the first pass is a warm-up and is not counted
};

// Profiling (time_costs, size_costs and the balances built on them) runs every layer in
// training mode, yet leaves the model exactly as it was: parameters, buffers (BatchNorm's
// running statistics), every `.grad` (undefined stays undefined), the train/eval flag of each
// module, and the default CPU generator's state. Each layer runs as a deep copy with
// requires_grad as the original's; a layer that cannot be cloned (a torch::nn::Module that is
// not torch::nn::Cloneable) runs itself, with its state saved before and put back after.

// Seconds per layer of forward plus backward on `sample`, averaged over repeated passes.
// Each layer runs on the previous layer's output, detached, so its backward is its own (popped
// skip tensors are detached too).
std::vector<double> time_costs(const torch::nn::Sequential& model, const Batch& sample,
                               const TimeProfileOptions& options = {});

// Bytes per layer: parameter bytes times `param_scale` (2 for SGD with momentum, 4 for Adam:
// weights, gradients and optimizer state) plus the bytes of its outputs on `sample`.
std::vector<double> size_costs(const torch::nn::Sequential& model, const Batch& sample,
                               double param_scale = 2.0);

// The min-max balances over those costs (torchgpipe's balance_by_time / balance_by_size).
std::vector<int64_t> balance_by_time(int64_t parts, const torch::nn::Sequential& model,
                                     const Batch& sample, const TimeProfileOptions& options = {},
                                     const MinMaxOptions& extras = {});
std::vector<int64_t> balance_by_size(int64_t parts, const torch::nn::Sequential& model,
                                     const Batch& sample, double param_scale = 2.0,
                                     const MinMaxOptions& extras = {});
std::vector<int64_t> balance_by_params(int64_t parts, const torch::nn::Sequential& model,
                                       const MinMaxOptions& extras = {});

// A short class name for a module: "torch::nn::Linear" -> "Linear", "LinearImpl" -> "Linear".
std::string short_type_name(const torch::nn::Module& module);

}  // namespace pipetrain
