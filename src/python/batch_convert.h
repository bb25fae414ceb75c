// Micro-batch values between Python and the runtime: a tensor, or a tuple of tensors.
#pragma once

#include <torch/extension.h>

#include <string>

#include "pipetrain/batch/batch.h"

namespace pipetrain::python {

namespace py = pybind11;

// A tensor as an atomic batch, a tuple (or list) of tensors as a tuple batch. Anything else is a
// BatchError (TypeError in Python) naming `what` and the type seen. Under the GIL.
Batch to_batch(py::handle value, const std::string& what);
// The batch as a tensor or a tuple of tensors (an undefined tensor of a skip as None).
py::object from_batch(const Batch& batch);
// The Python type name of a value, for messages.
std::string type_name(py::handle value);

}  // namespace pipetrain::python
