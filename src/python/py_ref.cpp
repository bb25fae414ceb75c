// Python objects held by native code, and calls into Python from native threads.
#include "py_ref.h"

namespace pipetrain::python {

PyRef::PyRef(py::object object)
    : object_(new py::object(std::move(object)), [](py::object* held) {
        if (!Py_IsInitialized()) {
          held->release();  // the interpreter is gone: nothing left to decrement
        } else {
          py::gil_scoped_acquire gil;
          *held = py::object();
        }
        delete held;
      }) {}

void throw_foreign(const std::string& where, py::error_already_set& error) {
  ForeignError foreign(std::make_exception_ptr(error), error.what());
  if (where.empty()) throw foreign;
  throw foreign.with_context(where);  // a note on the Python exception, not a new message
}

}  // namespace pipetrain::python
