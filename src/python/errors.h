// pipetrain's C++ errors as Python exceptions (the classes are in pipetrain/errors.py).
#pragma once

#include <torch/extension.h>

namespace pipetrain::python {

namespace py = pybind11;

// Registers the translator: each pipetrain::Error subclass becomes the Python class of the same
// name (ConfigError is a ValueError, BatchError a TypeError, TimeoutError a builtins.TimeoutError,
// all of them pipetrain.PipelineError); a ForeignError becomes the Python exception it carries,
// with where it passed added as notes; LibTorch's value/type/index errors their Python kinds.
void register_error_translator();

}  // namespace pipetrain::python
