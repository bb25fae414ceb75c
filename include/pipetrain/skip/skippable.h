// Skip connections: layers that stash a named tensor and later layers that pop it
// (torchgpipe's @skippable with stash/pop, and namespaces for repeated blocks).
//
//   skip::Namespace down1;                               // a repeated block's own names
//   torch::nn::Sequential model(
//       conv1, skip::stash("x", down1),                  // keeps its input under "x"
//       conv2, relu, conv3,
//       skip::pop_add("x", down1),                       // returns input + the stashed "x"
//       head);
//
// A layer declares what it stashes and pops; skip::plan_skips checks the declarations of a
// whole model before its first forward (every pop has exactly one earlier stash, every stash
// is popped, no key is stashed twice) and the pipelines route each stashed tensor straight to
// the partition that pops it (skip/plan.h). Outside a pipeline the layers run as an ordinary
// Sequential: stashed tensors wait in a per-thread SkipTracker (skip/tracker.h).
//
// Write a skippable layer with parameters by deriving from SkippableImpl and overriding
// forward_skips; a stateless one with a Body function.
//
// Optional skips (torchgpipe's None): a layer may stash an undefined torch::Tensor, for
// instance when a branch is off for this input. It travels like any stashed tensor (across
// partitions, checkpoints and engine stages) and the popping layer receives it undefined and
// decides: pop_add adds nothing, pop_cat raises ModuleError (concatenating nothing would change
// the width).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "pipetrain/skip/tracker.h"

namespace pipetrain::skip {

// A scope for skip names, so copies of one block can stash and pop the same names. Named
// namespaces are the same on every rank; unnamed ones are numbered in creation order, which
// is the same on ranks that build the model description the same way.
class Namespace {
 public:
  Namespace();
  explicit Namespace(std::string name);
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// The names one layer stashes and pops, each a key in some namespace.
struct SkipDeclaration {
  std::vector<SkipKey> stash;
  std::vector<SkipKey> pop;

  // Names in the default namespace.
  static SkipDeclaration of(const std::vector<std::string>& stash, const std::vector<std::string>& pop);
  bool empty() const { return stash.empty() && pop.empty(); }
  // Every key moved into `ns`.
  SkipDeclaration isolated(const Namespace& ns) const;
  // "stash [x], pop [block1/y]"
  std::string describe() const;
  // The same keys, whatever their order (the order names are declared in carries no meaning).
  bool operator==(const SkipDeclaration& other) const;
  bool operator!=(const SkipDeclaration& other) const { return !(*this == other); }
};

class SkippableImpl;

// What a skippable layer's forward gets: stash and pop by the names it declared.
class Skips {
 public:
  Skips(const SkippableImpl& layer, SkipTracker& tracker) : layer_(layer), tracker_(tracker) {}
  // ModuleError for a name the layer did not declare as stashed. `tensor` may be undefined
  // (an optional skip).
  void stash(const std::string& name, torch::Tensor tensor);
  // ModuleError for a name the layer did not declare as popped, or when nothing was stashed.
  // Undefined when the stashing layer stashed an undefined tensor.
  torch::Tensor pop(const std::string& name);
  // After the layer's forward: every declared stash stashed and every declared pop popped, as
  // torchgpipe's Skippable checks (ModuleError "'x' must be stashed but have not" / "must be
  // popped but have not"). A declared pop left in the tracker is dropped first.
  void check_all_used();

 private:
  const SkipKey& key(const std::vector<SkipKey>& keys, const std::string& name, const char* what) const;

  const SkippableImpl& layer_;
  SkipTracker& tracker_;
  std::vector<SkipKey> stashed_;
  std::vector<SkipKey> popped_;
};

class SkippableImpl : public torch::nn::Module {
 public:
  using Body = std::function<torch::Tensor(const torch::Tensor& input, Skips& skips)>;

  SkippableImpl(std::vector<std::string> stash, std::vector<std::string> pop, Body body,
                std::string name = "Skippable");

  // Moves every name into `ns` (torchgpipe's isolate). Call before the model is pipelined.
  SkippableImpl& isolate(const Namespace& ns);

  torch::Tensor forward(const torch::Tensor& input);
  const SkipDeclaration& declaration() const { return declaration_; }
  const std::string& layer_name() const { return name_; }
  void pretty_print(std::ostream& stream) const override;
  // A copy of a Body-based skippable (Sequential::clone); subclasses clone as torch's modules
  // do (derive from torch::nn::Cloneable as well).
  std::shared_ptr<torch::nn::Module> clone(
      const torch::optional<torch::Device>& device = torch::nullopt) const override;

 protected:
  // For subclasses that override forward_skips.
  SkippableImpl(std::vector<std::string> stash, std::vector<std::string> pop, std::string name);
  // For subclasses whose names are already in their namespaces (a Python skippable).
  SkippableImpl(SkipDeclaration declaration, std::string name);
  virtual torch::Tensor forward_skips(const torch::Tensor& input, Skips& skips);

 private:
  SkipDeclaration declaration_;
  Body body_;
  std::string name_;
};
TORCH_MODULE(Skippable);

// Identity that stashes its input under `name`.
Skippable stash(const std::string& name);
// input + popped `name` (a residual or long skip); the input alone when the popped tensor is
// undefined.
Skippable pop_add(const std::string& name);
// torch::cat({input, popped `name`}, dim) (a U-Net's skip); ModuleError when the popped tensor
// is undefined.
Skippable pop_cat(const std::string& name, int64_t dim = 1);
// The same with the name in namespace `ns`.
Skippable stash(const std::string& name, const Namespace& ns);
Skippable pop_add(const std::string& name, const Namespace& ns);
Skippable pop_cat(const std::string& name, const Namespace& ns, int64_t dim = 1);

// The layer as a skippable, or null.
std::shared_ptr<SkippableImpl> as_skippable(const std::shared_ptr<torch::nn::Module>& module);

}  // namespace pipetrain::skip
