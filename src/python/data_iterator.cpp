// A Python iterator of (inputs, labels) as the engine's data source.
#include "data_iterator.h"

#include "batch_convert.h"
#include "pipetrain/error.h"

namespace pipetrain::python {
namespace {

// A Python number (an int class label, a float target) as a 0-d tensor, as a DataLoader's
// default collate makes tensors of them; other values go to to_batch (which names them).
py::object numbers_as_tensors(py::handle value) {
  auto is_number = [](py::handle v) { return PyBool_Check(v.ptr()) || PyLong_Check(v.ptr()) || PyFloat_Check(v.ptr()); };
  bool numbers = is_number(value);
  // A list of labels ([3, 1]) is one tensor too, not a tuple of values.
  if (!numbers && (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) && py::len(value) > 0) {
    numbers = true;
    for (py::handle item : value) numbers = numbers && is_number(item);
  }
  if (numbers) return py::module_::import("torch").attr("as_tensor")(value);
  return py::reinterpret_borrow<py::object>(value);
}

}  // namespace

PyDataIterator::PyDataIterator(py::object iterator) : iterator_(std::move(iterator)) {
  // PyIter_Next on anything but an iterator is undefined behaviour: a list or a DataLoader
  // must have been turned into an iterator (iter()) by the caller.
  if (!PyIter_Check(iterator_.get().ptr())) {
    throw BatchError("the data iterator is a " + type_name(iterator_.get()) +
                     ", not an iterator; pass iter(" + type_name(iterator_.get()) + ") or a RepeatingLoader");
  }
}

std::optional<MicroBatch> PyDataIterator::next() {
  const int64_t index = items_++;
  return with_gil("the data iterator", [&]() -> std::optional<MicroBatch> {
    py::object item = py::reinterpret_steal<py::object>(PyIter_Next(iterator_.get().ptr()));
    if (!item) {
      if (PyErr_Occurred()) throw py::error_already_set();
      // Raised as Python's own StopIteration: DeepSpeed's engine lets next()'s escape too.
      PyErr_SetString(PyExc_StopIteration, ("the data iterator ran out at micro-batch " + std::to_string(index) +
                                            " (every step pulls gradient_accumulation_steps of them)").c_str());
      throw py::error_already_set();
    }
    if (!(py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) || py::len(item) != 2) {
      throw DataError("item " + std::to_string(index) + " of the data iterator is a " + type_name(item) +
                      (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)
                           ? " of " + std::to_string(py::len(item)) + " values"
                           : std::string()) +
                      "; each item must be a pair (inputs, labels) of tensors or tuples of tensors");
    }
    MicroBatch mb;
    mb.inputs = to_batch(numbers_as_tensors(item[py::int_(0)]), "the inputs of data item " + std::to_string(index));
    mb.labels = to_batch(numbers_as_tensors(item[py::int_(1)]), "the labels of data item " + std::to_string(index));
    return mb;
  });
}

}  // namespace pipetrain::python
