// The sandbox that profiling runs a layer in, so that balancing leaves the user's model as it
// was (torchgpipe's layerwise_sandbox).
//
// Profiling runs forward and backward in training mode: on the user's own layer that would add
// to every `.grad`, move BatchNorm's running statistics and leave the layer in training mode.
// So each layer is profiled as one of two stand-ins, chosen per layer:
//
//   layer can be cloned  ──► a deep copy: training mode, requires_grad as the original's;
//                            the original is never run
//   clone() throws       ──► the original itself, under a snapshot: parameter and buffer values
//   (a plain Module,         copied, gradients taken off (profiling accumulates into fresh
//   not Cloneable)           ones), train flags saved; all put back when the sandbox ends,
//                            also when profiling throws
//
// A sandbox holds one layer at a time (its copy, or its snapshot), so profiling needs memory
// for the model plus one layer, not two models.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

namespace pipetrain::detail {

class LayerSnapshot;

class LayerSandbox {
 public:
  explicit LayerSandbox(const torch::nn::AnyModule& layer);
  ~LayerSandbox();  // restores the original layer when it runs under a snapshot
  LayerSandbox(const LayerSandbox&) = delete;
  LayerSandbox& operator=(const LayerSandbox&) = delete;

  // The layer to profile, in training mode.
  torch::nn::AnyModule& layer() { return layer_; }
  // Whether it is a copy (false: the original under a snapshot).
  bool copied() const { return snapshot_ == nullptr; }

 private:
  torch::nn::AnyModule layer_;
  std::unique_ptr<LayerSnapshot> snapshot_;
};

// Puts the default CPU generator's state back at the end of the scope: cloning re-runs the
// layers' initialisers (Cloneable::clone calls reset()) and profiling draws dropout masks, and
// neither should shift the numbers the user's program draws next. (CUDA generators are left
// alone: partition does not depend on runtime, whose RngSnapshot covers them.)
class DefaultGeneratorGuard {
 public:
  DefaultGeneratorGuard();
  ~DefaultGeneratorGuard();
  DefaultGeneratorGuard(const DefaultGeneratorGuard&) = delete;
  DefaultGeneratorGuard& operator=(const DefaultGeneratorGuard&) = delete;

 private:
  torch::Tensor state_;
};

}  // namespace pipetrain::detail
