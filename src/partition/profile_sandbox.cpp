// The sandbox that profiling runs a layer in: a copy, or the original under a snapshot.
#include "profile_sandbox.h"

#include <ATen/CPUGeneratorImpl.h>

#include <optional>
#include <unordered_set>

namespace pipetrain::detail {

// Everything profiling may change on a layer it runs itself, taken when the sandbox opens and
// put back when it closes.
class LayerSnapshot {
 public:
  explicit LayerSnapshot(const std::shared_ptr<torch::nn::Module>& root) {
    std::unordered_set<const void*> seen;  // a parameter shared by two children counts once
    for (auto& p : root->parameters(/*recurse=*/true)) {
      if (!p.defined() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      params_.push_back({p, p.detach().clone(), p.grad()});
    }
    for (auto& b : root->buffers(/*recurse=*/true)) {
      if (!b.defined() || !seen.insert(b.unsafeGetTensorImpl()).second) continue;
      buffers_.push_back({b, b.detach().clone()});
    }
    // modules() lists a module before its children, the order restore() needs.
    for (auto& m : root->modules(/*include_self=*/true)) modes_.push_back({m, m->is_training()});
    // Only now, with every copy taken, is anything changed: the user's gradient is taken off
    // rather than copied, so profiling accumulates into a fresh one and the original tensor
    // (its identity and its value) goes back untouched.
    for (auto& p : params_) p.param.mutable_grad() = torch::Tensor();
  }

  void restore() {
    torch::NoGradGuard no_grad;
    for (auto& p : params_) {
      p.param.detach().copy_(p.value);
      p.param.mutable_grad() = p.grad;
    }
    for (auto& [buffer, value] : buffers_) buffer.detach().copy_(value);
    // train() also sets the children; each child then sets its own flag again.
    for (auto& [module, training] : modes_) module->train(training);
  }

 private:
  struct Param {
    torch::Tensor param;
    torch::Tensor value;
    torch::Tensor grad;  // the user's gradient tensor itself, or undefined
  };
  std::vector<Param> params_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers_;  // buffer, its value
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
};

namespace {

// A deep copy of the layer whose parameters require grad as the original's do (clone() gives
// every parameter requires_grad, frozen ones included); nullopt when the layer cannot be
// copied: Module::clone() throws for modules that are not torch::nn::Cloneable.
std::optional<torch::nn::AnyModule> deep_copy(const torch::nn::AnyModule& layer) {
  torch::nn::AnyModule copy;
  try {
    copy = layer.clone();
  } catch (const std::exception&) {
    return std::nullopt;  // the original runs under a snapshot instead
  }
  // clone() of another dynamic type than the layer's leaves the holder empty.
  if (copy.is_empty() || !copy.ptr()) return std::nullopt;
  const auto originals = layer.ptr()->parameters(/*recurse=*/true);
  auto copies = copy.ptr()->parameters(/*recurse=*/true);
  if (originals.size() != copies.size()) return std::nullopt;
  for (size_t k = 0; k < copies.size(); ++k) copies[k].requires_grad_(originals[k].requires_grad());
  return copy;
}

}  // namespace

LayerSandbox::LayerSandbox(const torch::nn::AnyModule& layer) {
  if (auto copy = deep_copy(layer)) {
    layer_ = std::move(*copy);
  } else {
    snapshot_ = std::make_unique<LayerSnapshot>(layer.ptr());
    layer_ = layer;
  }
  layer_.ptr()->train(true);
}

LayerSandbox::~LayerSandbox() {
  if (snapshot_) snapshot_->restore();
}

DefaultGeneratorGuard::DefaultGeneratorGuard() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  state_ = gen.get_state();
}

DefaultGeneratorGuard::~DefaultGeneratorGuard() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state_);
}

}  // namespace pipetrain::detail
