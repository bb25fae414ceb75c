// Layers written in Python, run by the native runtime.
//
// A PyLayer holds a Python nn.Module. Its parameters and buffers are the Python module's own
// tensors, registered here under the same dotted names (a child module becomes a child of the
// same name), so the engine's optimizer, gradient reductions and per-layer checkpoints act on
// exactly the tensors Python sees. Each forward takes the GIL for the Python call only, so
// native work of other partitions and stages goes on meanwhile.
#pragma once

#include <torch/extension.h>

#include <string>

#include "pipetrain/batch/batch.h"
#include "pipetrain/skip/skippable.h"
#include "py_ref.h"

namespace pipetrain::python {

// Registers the Python module's parameters and persistent buffers on `shell`, and a child
// module per Python child, recursively (non-persistent buffers stay out of checkpoints; they
// reach the device through PyLayer::to, which moves the Python module). A tensor met twice (a weight shared inside the layer)
// is registered once, where Python's named_parameters() lists it. Under the GIL.
void mirror_tensors(py::handle module, torch::nn::Module& shell);

class PyLayerImpl : public torch::nn::Module, public BatchLayer {
 public:
  // `name` is for messages ("layer 3 (Attention)"). Under the GIL.
  PyLayerImpl(py::object module, std::string name);

  Batch forward_batch(const Batch& input) override;
  // The signature torch::nn::AnyModule needs; call_layer takes forward_batch.
  torch::Tensor forward(const torch::Tensor& input);
  // Sets the Python module's mode too (dropout and batch norm inside it follow).
  void train(bool on = true) override;
  // Moves or casts the Python module itself (module.to, as DeepSpeed places a stage's layers),
  // so that what is not mirrored here, non-persistent buffers (a causal mask, a rotary table),
  // follows the parameters onto the stage's device; then the mirrored tensors, the same ones.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  void pretty_print(std::ostream& stream) const override;

  const PyRef& module() const { return module_; }

 private:
  PyRef module_;
  std::string name_;
};
TORCH_MODULE(PyLayer);

// A Python skippable (pipetrain.skip.skippable): a PyLayer that declares the skips its Python
// module stashes and pops, so that pipelines route them between partitions and stages. The
// Python module stashes into and pops from the tracker the runtime installs (skip/tracker.h).
class PySkippableImpl : public skip::SkippableImpl, public BatchLayer {
 public:
  PySkippableImpl(py::object module, skip::SkipDeclaration declaration, std::string name);

  Batch forward_batch(const Batch& input) override;
  torch::Tensor forward(const torch::Tensor& input);
  void train(bool on = true) override;
  // As PyLayerImpl's: the Python module moves itself, non-persistent buffers included.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  const PyRef& module() const { return module_; }

 private:
  PyRef module_;
  std::string name_;
};
TORCH_MODULE(PySkippable);

}  // namespace pipetrain::python
