// Layers written in Python, run by the native runtime.
#include "py_layer.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/DynamicTypes.h>

#include <unordered_set>

#include "batch_convert.h"

namespace pipetrain::python {
namespace {

void mirror_into(py::handle module, torch::nn::Module& shell, std::unordered_set<const void*>& seen) {
  py::dict parameters = module.attr("_parameters");
  for (auto item : parameters) {
    if (item.second.is_none()) continue;
    torch::Tensor t = THPVariable_Unpack(item.second.ptr());
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    shell.register_parameter(py::str(item.first), t, t.requires_grad());
  }
  py::object non_persistent = py::getattr(module, "_non_persistent_buffers_set", py::set());
  py::dict buffers = module.attr("_buffers");
  for (auto item : buffers) {
    if (item.second.is_none() || non_persistent.contains(item.first)) continue;
    torch::Tensor t = THPVariable_Unpack(item.second.ptr());
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    shell.register_buffer(py::str(item.first), t);
  }
  py::dict children = module.attr("_modules");
  for (auto item : children) {
    if (item.second.is_none()) continue;
    auto child = std::make_shared<torch::nn::Module>(type_name(item.second));
    mirror_into(item.second, *child, seen);
    shell.register_module(py::str(item.first), child);
  }
}

Batch call_python(const PyRef& module, const Batch& input, const std::string& name) {
  return with_gil(name, [&] {
    py::object out = module.get()(from_batch(input));
    return to_batch(out, "the output of " + name);
  });
}

void train_python(const PyRef& module, bool on, const std::string& name) {
  with_gil(name + ".train()", [&] { module.get().attr("train")(on); });
}

// module.to(*args) under the GIL. Python's nn.Module.to replaces each tensor's data in place
// (param.data = ...), so the tensors mirrored on the shell stay the Python module's own.
void to_python(const PyRef& module, const std::string& name, const py::tuple& args) {
  with_gil(name + ".to()", [&] { module.get().attr("to")(*args); });
}

py::object py_device(torch::Device device) { return py::module_::import("torch").attr("device")(device.str()); }

py::object py_dtype(torch::Dtype dtype) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));
}

}  // namespace

void mirror_tensors(py::handle module, torch::nn::Module& shell) {
  std::unordered_set<const void*> seen;
  mirror_into(module, shell, seen);
}

PyLayerImpl::PyLayerImpl(py::object module, std::string name)
    : torch::nn::Module(type_name(module)), module_(std::move(module)), name_(std::move(name)) {
  mirror_tensors(module_.get(), *this);
  torch::nn::Module::train(module_.get().attr("training").cast<bool>());
}

Batch PyLayerImpl::forward_batch(const Batch& input) { return call_python(module_, input, name_); }

torch::Tensor PyLayerImpl::forward(const torch::Tensor& input) { return forward_batch(Batch(input)).tensor(); }

void PyLayerImpl::train(bool on) {
  torch::nn::Module::train(on);
  train_python(module_, on, name_);
}

void PyLayerImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  with_gil(name_ + ".to()", [&] { to_python(module_, name_, py::make_tuple(py_device(device), py_dtype(dtype))); });
  torch::nn::Module::to(device, dtype, non_blocking);
}

void PyLayerImpl::to(torch::Dtype dtype, bool non_blocking) {
  with_gil(name_ + ".to()", [&] { to_python(module_, name_, py::make_tuple(py_dtype(dtype))); });
  torch::nn::Module::to(dtype, non_blocking);
}

void PyLayerImpl::to(torch::Device device, bool non_blocking) {
  with_gil(name_ + ".to()", [&] { to_python(module_, name_, py::make_tuple(py_device(device))); });
  torch::nn::Module::to(device, non_blocking);
}

void PyLayerImpl::pretty_print(std::ostream& stream) const { stream << "pipetrain.PyLayer(" << name_ << ")"; }

PySkippableImpl::PySkippableImpl(py::object module, skip::SkipDeclaration declaration, std::string name)
    : skip::SkippableImpl(std::move(declaration), name), module_(std::move(module)), name_(std::move(name)) {
  mirror_tensors(module_.get(), *this);
  torch::nn::Module::train(module_.get().attr("training").cast<bool>());
}

Batch PySkippableImpl::forward_batch(const Batch& input) { return call_python(module_, input, name_); }

torch::Tensor PySkippableImpl::forward(const torch::Tensor& input) { return forward_batch(Batch(input)).tensor(); }

void PySkippableImpl::train(bool on) {
  torch::nn::Module::train(on);
  train_python(module_, on, name_);
}

void PySkippableImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  with_gil(name_ + ".to()", [&] { to_python(module_, name_, py::make_tuple(py_device(device), py_dtype(dtype))); });
  skip::SkippableImpl::to(device, dtype, non_blocking);
}

void PySkippableImpl::to(torch::Dtype dtype, bool non_blocking) {
  with_gil(name_ + ".to()", [&] { to_python(module_, name_, py::make_tuple(py_dtype(dtype))); });
  skip::SkippableImpl::to(dtype, non_blocking);
}

void PySkippableImpl::to(torch::Device device, bool non_blocking) {
  with_gil(name_ + ".to()", [&] { to_python(module_, name_, py::make_tuple(py_device(device))); });
  skip::SkippableImpl::to(device, non_blocking);
}

}  // namespace pipetrain::python
