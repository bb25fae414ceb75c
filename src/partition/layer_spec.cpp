// Layer specs: a model described as factories, so each stage builds only its own layers.
#include "pipetrain/partition/layer_spec.h"

#include <map>
#include <unordered_set>

#include "pipetrain/error.h"

namespace pipetrain {

BuiltLayers build_layers(const std::vector<LayerSpec>& specs, int64_t begin, int64_t end,
                         const std::function<void(int64_t)>& before_each) {
  if (begin < 0 || end > static_cast<int64_t>(specs.size()) || begin > end) {
    throw ConfigError("layer range [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") is outside the model's " + std::to_string(specs.size()) +
                      " layer specs; the balance must add up to the number of specs");
  }
  BuiltLayers built;
  built.begin = begin;
  std::map<std::string, torch::nn::AnyModule> tied;
  for (int64_t i = begin; i < end; ++i) {
    const LayerSpec& spec = specs[i];
    if (!spec.build) {
      throw ConfigError("layer spec " + std::to_string(i) + " (" + spec.name +
                        ") has no factory; set LayerSpec::build");
    }
    if (spec.tied()) {
      auto it = tied.find(spec.tied_key);
      if (it == tied.end()) {
        if (before_each) before_each(i);
        it = tied.emplace(spec.tied_key, spec.build()).first;
      }
      built.modules.push_back(it->second);
    } else {
      if (before_each) before_each(i);
      built.modules.push_back(spec.build());
    }
    auto skippable = skip::as_skippable(built.modules.back().ptr());
    const skip::SkipDeclaration built_skips = skippable ? skippable->declaration() : skip::SkipDeclaration();
    if (built_skips != spec.skips) {
      throw ModuleError("layer spec " + std::to_string(i) + " (" + spec.name + ") declares skips " +
                        spec.skips.describe() + " but its module declares " + built_skips.describe() +
                        "; make LayerSpec::skips match the module (LayerSpec::skippable)");
    }
    built.specs.push_back(spec);
  }
  return built;
}

Batch BuiltLayers::forward_layer(size_t local_index, const Batch& input) {
  auto& module = modules.at(local_index);
  const auto& spec = specs.at(local_index);
  if (spec.forward) return spec.forward(module, input);
  return call_layer(module, input, begin + static_cast<int64_t>(local_index));
}

Batch BuiltLayers::forward(const Batch& input) {
  skip::SkipTracker tracker;
  skip::TrackerScope scope(tracker);
  Batch x = input;
  for (size_t i = 0; i < modules.size(); ++i) x = forward_layer(i, x);
  return x;
}

skip::SkipPlan skip_plan(const std::vector<LayerSpec>& specs) {
  std::vector<skip::SkipDeclaration> declarations;
  std::vector<std::string> names;
  for (const auto& spec : specs) {
    declarations.push_back(spec.skips);
    names.push_back(spec.name);
  }
  return skip::SkipPlan(declarations, names);
}

std::vector<torch::Tensor> BuiltLayers::parameters() const {
  std::vector<torch::Tensor> params;
  std::unordered_set<const torch::nn::Module*> seen;
  for (const auto& module : modules) {
    if (!seen.insert(module.ptr().get()).second) continue;
    for (const auto& p : module.ptr()->parameters()) params.push_back(p);
  }
  return params;
}

}  // namespace pipetrain
