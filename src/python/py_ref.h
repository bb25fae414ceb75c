// Python objects held by native code, and calls into Python from native threads.
//
// The runtime runs layers, losses and data iterators on threads of its own with the GIL
// released; whatever of those is written in Python is called through with_gil, which takes the
// GIL for the call only and turns a Python exception into a ForeignError that carries it, so it
// reaches the Python caller as it was raised, traceback included.
#pragma once

#include <torch/extension.h>

#include <memory>
#include <string>
#include <utility>

#include "pipetrain/error.h"

namespace pipetrain::python {

namespace py = pybind11;

// A reference to a Python object that native code may copy and drop on any thread, with or
// without the GIL: the last copy takes the GIL to release it (and leaks it when the interpreter
// is already gone, as at exit).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object object);
  // Use under the GIL.
  const py::object& get() const { return *object_; }
  bool defined() const { return object_ && *object_; }

 private:
  std::shared_ptr<py::object> object_;
};

// `where` and the Python exception's own message, as a ForeignError carrying the exception.
[[noreturn]] void throw_foreign(const std::string& where, py::error_already_set& error);

// Runs `f` with the GIL held (re-entrant on a thread that holds it already).
template <typename F>
auto with_gil(const std::string& where, F&& f) -> decltype(f()) {
  py::gil_scoped_acquire gil;
  try {
    return f();
  } catch (py::error_already_set& error) {
    throw_foreign(where, error);
  }
}

}  // namespace pipetrain::python
