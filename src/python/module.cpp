// The extension module pipetrain._C: the native runtime as the Python package sees it.
#include <torch/extension.h>

#include "errors.h"
#include "layer.h"
#include "pipetrain/version.h"

namespace pipetrain::python {
void bind_gpipe(py::module& m);
void bind_runtime(py::module& m);
void bind_engine(py::module& m);
void bind_partition(py::module& m);
}  // namespace pipetrain::python

PYBIND11_MODULE(_C, m) {
  namespace pp = pipetrain::python;
  m.doc() = "pipetrain's native runtime (use the pipetrain package, not this module)";
  m.attr("__version__") = PIPETRAIN_VERSION;
  pp::register_error_translator();
  pp::bind_layers(m);
  pp::bind_gpipe(m);
  pp::bind_runtime(m);
  pp::bind_engine(m);
  pp::bind_partition(m);
}
