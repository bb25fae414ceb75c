// Micro-batch values between Python and the runtime: a tensor, or a tuple of tensors.
#include "batch_convert.h"

#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "pipetrain/error.h"

namespace pipetrain::python {

std::string type_name(py::handle value) { return py::str(py::type::handle_of(value).attr("__name__")); }

Batch to_batch(py::handle value, const std::string& what) {
  if (THPVariable_Check(value.ptr())) return Batch(THPVariable_Unpack(value.ptr()));
  if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    std::vector<torch::Tensor> tensors;
    size_t i = 0;
    for (py::handle item : value) {
      if (!THPVariable_Check(item.ptr())) {
        throw BatchError(what + " holds a " + type_name(item) + " at position " + std::to_string(i) +
                         "; expected Tensor or Tuple[Tensor, ...]: pass other values as tensors or keep "
                         "them inside the layer");
      }
      tensors.push_back(THPVariable_Unpack(item.ptr()));
      ++i;
    }
    return Batch::tuple(std::move(tensors));
  }
  throw BatchError(what + " is a " + type_name(value) +
                   "; expected Tensor or Tuple[Tensor, ...] (layers of a pipeline take and return tensors)");
}

py::object from_batch(const Batch& batch) {
  auto wrap = [](const torch::Tensor& t) -> py::object {
    if (!t.defined()) return py::none();
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  };
  if (batch.atomic()) return wrap(batch.tensor());
  py::tuple out(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) out[i] = wrap(batch[i]);
  return out;
}

}  // namespace pipetrain::python
