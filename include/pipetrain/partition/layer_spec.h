// Layer specs: a model described as factories, so each stage builds only its own layers.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/skip/plan.h"

namespace pipetrain {

// One layer of a pipelined model (DeepSpeed's LayerSpec / TiedLayerSpec).
//
// A plain spec builds its module on the stage that owns it. A tied spec names a `tied_key`:
// every spec with that key uses one shared module (built by the first of them on each stage
// that needs it); the engine makes the copies on different stages equal at start and
// all-reduces their gradients. A tied use may run its own `forward` on the shared module, e.g.
// an output projection through the token embedding's weight.
struct LayerSpec {
  using Factory = std::function<torch::nn::AnyModule()>;
  using Forward = std::function<Batch(torch::nn::AnyModule& module, const Batch& input)>;

  std::string name;      // for logs and errors, e.g. "Linear(1024, 1024)"
  std::string type;      // matched by partitioning on a type regex, e.g. "Linear"
  Factory build;         // makes a fresh module (its own initialisation)
  std::string tied_key;  // empty for a plain layer
  // The tied parameters by name (DeepSpeed's tied_weight_attr): only these are shared across
  // stages, the module's others stay each stage's own. Empty: every parameter is tied.
  std::vector<std::string> tied_params;
  Forward forward;       // empty: call the module's own forward
  // What the layer stashes and pops (skip/skippable.h). Every stage needs the whole model's
  // skips to route them, but builds only its own layers, so the spec carries them; a built
  // skip::Skippable must declare exactly these.
  skip::SkipDeclaration skips;

  bool tied() const { return !tied_key.empty(); }

  // A plain layer from a module holder type, e.g. LayerSpec::of<torch::nn::Linear>(1024, 1024).
  template <typename Holder, typename... Args>
  static LayerSpec of(std::string type, Args... args) {
    LayerSpec spec;
    spec.type = type;
    spec.name = std::move(type);
    spec.build = [args...] { return torch::nn::AnyModule(Holder(args...)); };
    return spec;
  }

  // A plain layer from any factory.
  static LayerSpec make(std::string name, std::string type, Factory build) {
    LayerSpec spec;
    spec.name = std::move(name);
    spec.type = std::move(type);
    spec.build = std::move(build);
    return spec;
  }

  // A skippable layer, e.g. skippable("stash x", "Stash", [] { return AnyModule(skip::stash("x")); },
  // SkipDeclaration::of({"x"}, {})).
  static LayerSpec skippable(std::string name, std::string type, Factory build, skip::SkipDeclaration skips) {
    LayerSpec spec = make(std::move(name), std::move(type), std::move(build));
    spec.skips = std::move(skips);
    return spec;
  }

  // A tied layer: all specs with `key` share one module; `forward` (optional) replaces the
  // module's own forward at this use.
  static LayerSpec tied_layer(std::string key, std::string name, std::string type, Factory build,
                              Forward forward = {}) {
    LayerSpec spec = make(std::move(name), std::move(type), std::move(build));
    spec.tied_key = std::move(key);
    spec.forward = std::move(forward);
    return spec;
  }
};

// The layers [begin, end) of a model, built locally. Tied specs in the range that share a key
// share one module: `modules[i]` for the first use, the same pointer for later uses.
struct BuiltLayers {
  std::vector<torch::nn::AnyModule> modules;  // one per spec in the range
  std::vector<LayerSpec> specs;               // the specs in the range
  int64_t begin = 0;

  Batch forward_layer(size_t local_index, const Batch& input);
  // All layers in order, with a fresh skip tracker (a whole model, or a range without skips
  // that leave it).
  Batch forward(const Batch& input);
  std::vector<torch::Tensor> parameters() const;  // each shared module's parameters once
};

// The skips of a model described by specs, checked (ModuleError as skip::SkipPlan).
skip::SkipPlan skip_plan(const std::vector<LayerSpec>& specs);

// Builds the specs [begin, end) in order. Tied layers built here take the same module for
// every use of their key inside the range. `before_each(i)` runs before layer i is built (the
// engine seeds the generator there, so a layer's initial weights do not depend on which
// stage builds it).
BuiltLayers build_layers(const std::vector<LayerSpec>& specs, int64_t begin, int64_t end,
                         const std::function<void(int64_t)>& before_each = {});

}  // namespace pipetrain
