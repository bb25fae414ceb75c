// pipetrain's C++ errors as Python exceptions (the classes are in pipetrain/errors.py).
#include "errors.h"

#include <c10/util/Exception.h>

#include "pipetrain/error.h"

namespace pipetrain::python {
namespace {

void raise(const char* class_name, const char* what) {
  // Looked up at each error (rare), so that nothing Python outlives the interpreter in a static.
  py::object cls = py::module_::import("pipetrain.errors").attr(class_name);
  PyErr_SetString(cls.ptr(), what);
}

void restore_foreign(const ForeignError& e) {
  try {
    std::rethrow_exception(e.original());
  } catch (py::error_already_set& original) {
    // Not original.restore(): that may run once, and one carried exception can leave several
    // calls (an engine's step, then its destructor's report).
    py::object value = original.value();
    if (PY_VERSION_HEX >= 0x030B0000 && py::hasattr(value, "add_note")) {
      for (auto it = e.context().rbegin(); it != e.context().rend(); ++it) {
        value.attr("add_note")("pipetrain: raised in " + *it);
      }
    }
    PyErr_Restore(original.type().inc_ref().ptr(), value.inc_ref().ptr(), original.trace().inc_ref().ptr());
  } catch (const std::exception& other) {
    raise("PipelineError", other.what());
  }
}

}  // namespace

void register_error_translator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ForeignError& e) {
      restore_foreign(e);
    } catch (const TimeoutError& e) {
      raise("TimeoutError", e.what());
    } catch (const PeerError& e) {
      raise("PeerError", e.what());
    } catch (const CommError& e) {
      raise("CommError", e.what());
    } catch (const BalanceError& e) {
      raise("BalanceError", e.what());
    } catch (const DeviceError& e) {
      raise("DeviceError", e.what());
    } catch (const ConfigError& e) {
      raise("ConfigError", e.what());
    } catch (const ModuleError& e) {
      raise("ModuleError", e.what());
    } catch (const BatchError& e) {
      raise("BatchError", e.what());
    } catch (const ScheduleError& e) {
      raise("ScheduleError", e.what());
    } catch (const CheckpointError& e) {
      raise("CheckpointError", e.what());
    } catch (const DataError& e) {
      raise("DataError", e.what());
    } catch (const NumericError& e) {
      raise("NumericError", e.what());
    } catch (const UsageError& e) {
      raise("UsageError", e.what());
    } catch (const Error& e) {
      raise("PipelineError", e.what());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
}

}  // namespace pipetrain::python
