// Automatic balancing: per-layer costs and the min-max balances built from them.
#include "pipetrain/partition/balance.h"

#include <regex>
#include <unordered_set>

#include "pipetrain/error.h"
#include "pipetrain/runtime/device.h"
#include "pipetrain/runtime/layer_profile.h"
#include "profile_sandbox.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Stashed tensors waiting in the tracker become detached leaves too, so the backward of the
// layer that pops one stops there instead of running into the stashing layer's graph (already
// freed by that layer's own backward). Undefined ones (optional skips) stay undefined.
void detach_stashed(skip::SkipTracker& skips) {
  for (const auto& key : skips.keys()) {
    torch::Tensor t = skips.pop(key);
    if (t.defined()) {
      t = t.detach();
      if (t.is_floating_point()) t.requires_grad_(true);
    }
    skips.stash(key, std::move(t));
  }
}

std::vector<torch::nn::AnyModule> layers_of(const torch::nn::Sequential& model) {
  std::vector<torch::nn::AnyModule> layers;
  for (const auto& layer : *model) layers.push_back(layer);
  return layers;
}

std::regex compile_type_pattern(const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error& e) {
    throw ConfigError("invalid layer type pattern '" + pattern + "': " + e.what() +
                      "; write an ECMAScript regex such as 'Linear|Conv2d'");
  }
}

std::vector<double> match_types(const std::vector<std::string>& types, const std::string& pattern) {
  const auto re = compile_type_pattern(pattern);
  std::vector<double> costs;
  bool any = false;
  for (const auto& type : types) {
    const bool hit = std::regex_search(type, re);
    any = any || hit;
    costs.push_back(hit ? 1.0 : 0.0);
  }
  if (!any) {
    std::string seen;
    std::unordered_set<std::string> listed;
    for (const auto& type : types) {
      if (listed.insert(type).second) seen += (seen.empty() ? "" : ", ") + type;
    }
    throw ConfigError("layer type pattern '" + pattern + "' matches no layer (types: " + seen +
                      "); pick a pattern that matches the layers to balance");
  }
  return costs;
}

}  // namespace

std::vector<int64_t> balance_uniform(int64_t layers, int64_t parts) {
  if (parts < 1 || parts > layers) {
    throw ConfigError("cannot split " + std::to_string(layers) + " layers into " +
                      std::to_string(parts) + " stages; use between 1 and " +
                      std::to_string(layers) + " stages");
  }
  std::vector<int64_t> balance(parts, layers / parts);
  for (int64_t j = 0; j < layers % parts; ++j) ++balance[j];
  return balance;
}

std::string short_type_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const auto colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

std::vector<double> parameter_costs(const torch::nn::Sequential& model) {
  std::vector<double> costs;
  for (const auto& layer : *model) {
    double count = 0;
    for (const auto& p : layer.ptr()->parameters()) count += static_cast<double>(p.numel());
    costs.push_back(count);
  }
  return costs;
}

std::vector<double> parameter_costs(const std::vector<LayerSpec>& specs) {
  std::vector<double> costs;
  std::unordered_set<std::string> tied_seen;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& spec = specs[i];
    if (spec.tied() && !tied_seen.insert(spec.tied_key).second) {
      costs.push_back(0.0);  // the shared module's parameters were counted at its first use
      continue;
    }
    auto built = build_layers(specs, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1);
    double count = 0;
    for (const auto& p : built.parameters()) count += static_cast<double>(p.numel());
    costs.push_back(count);
  }
  return costs;
}

std::vector<double> type_costs(const std::vector<LayerSpec>& specs, const std::string& pattern) {
  std::vector<std::string> types;
  for (const auto& spec : specs) types.push_back(spec.type.empty() ? spec.name : spec.type);
  return match_types(types, pattern);
}

std::vector<double> type_costs(const torch::nn::Sequential& model, const std::string& pattern) {
  std::vector<std::string> types;
  for (const auto& layer : *model) types.push_back(short_type_name(*layer.ptr()));
  return match_types(types, pattern);
}

// Both profilers run each layer in a sandbox (a copy, or the original under a snapshot: see
// profile_sandbox.h), so the model's parameters, buffers, gradients and train flags, and the
// default generator, are as they were when they return.
std::vector<double> time_costs(const torch::nn::Sequential& model, const Batch& sample,
                               const TimeProfileOptions& options) {
  auto layers = layers_of(model);
  std::vector<double> total(layers.size(), 0.0);
  torch::AutoGradMode grad_mode(true);
  detail::DefaultGeneratorGuard rng;
  const auto start = Clock::now();
  int64_t counted = 0;
  // On a GPU a layer's kernels are only queued when its call returns: the device is synchronised
  // around each timing (nothing to wait for on the CPU).
  const torch::Device device =
      sample.tensors().empty() ? torch::Device(torch::kCPU) : sample.tensors().front().device();
  for (int64_t pass = 0;; ++pass) {
    skip::SkipTracker skips;  // skippable layers stash and pop as in a forward of the model
    skip::TrackerScope scope(skips);
    Batch x = sample;
    for (size_t i = 0; i < layers.size(); ++i) {
      detail::LayerSandbox sandbox(layers[i]);
      const Batch input = runtime::detached_input(x);
      detach_stashed(skips);
      runtime::synchronize_device(device);
      const auto t0 = Clock::now();
      Batch y = call_layer(sandbox.layer(), input, static_cast<int64_t>(i));
      runtime::backward_ones(y);
      runtime::synchronize_device(device);
      if (pass > 0) total[i] += seconds_since(t0);
      x = y;
    }
    if (pass > 0) ++counted;
    const bool enough_passes = pass >= options.min_passes - 1 && counted > 0;
    if (enough_passes && Clock::now() - start >= options.budget) break;
  }
  for (auto& t : total) t /= static_cast<double>(counted);
  return total;
}

std::vector<double> size_costs(const torch::nn::Sequential& model, const Batch& sample,
                               double param_scale) {
  auto layers = layers_of(model);
  std::vector<double> costs;
  torch::AutoGradMode grad_mode(true);
  detail::DefaultGeneratorGuard rng;
  skip::SkipTracker skips;
  skip::TrackerScope scope(skips);
  Batch x = sample;
  for (size_t i = 0; i < layers.size(); ++i) {
    detail::LayerSandbox sandbox(layers[i]);
    double bytes = 0;
    for (const auto& p : sandbox.layer().ptr()->parameters()) {
      bytes += param_scale * static_cast<double>(p.numel() * p.element_size());
    }
    detach_stashed(skips);
    Batch y = call_layer(sandbox.layer(), runtime::detached_input(x), static_cast<int64_t>(i));
    for (const auto& t : y.tensors()) bytes += static_cast<double>(t.numel() * t.element_size());
    costs.push_back(bytes);
    x = y;
  }
  return costs;
}

std::vector<int64_t> balance_by_time(int64_t parts, const torch::nn::Sequential& model,
                                     const Batch& sample, const TimeProfileOptions& options,
                                     const MinMaxOptions& extras) {
  return min_max_partition(time_costs(model, sample, options), parts, extras);
}

std::vector<int64_t> balance_by_size(int64_t parts, const torch::nn::Sequential& model,
                                     const Batch& sample, double param_scale,
                                     const MinMaxOptions& extras) {
  return min_max_partition(size_costs(model, sample, param_scale), parts, extras);
}

std::vector<int64_t> balance_by_params(int64_t parts, const torch::nn::Sequential& model,
                                       const MinMaxOptions& extras) {
  return min_max_partition(parameter_costs(model), parts, extras);
}

}  // namespace pipetrain
