// A layer made from a Python module, as the runtime runs it.
#pragma once

#include <torch/extension.h>

#include <memory>
#include <string>

#include "py_ref.h"

namespace pipetrain::python {

// `module` is what the runtime calls: a native torch::nn module built around the Python module's
// own tensors where the module is one of torch.nn's that pipetrain runs natively (no GIL, the
// engine's Linear kernels), else a PyLayer. `source` is the Python module it was made from.
struct Layer {
  torch::nn::AnyModule module;
  PyRef source;
  std::string name;
  bool native = false;
};
using LayerPtr = std::shared_ptr<Layer>;

// The layers as one torch::nn::Sequential (children "0", "1", ...), in the Python model's mode.
torch::nn::Sequential sequential_of(const std::vector<LayerPtr>& layers, bool training);

void bind_layers(py::module& m);

}  // namespace pipetrain::python
