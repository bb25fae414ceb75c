// A Python iterator of (inputs, labels) as the engine's data source.
#include "data_iterator.h"

#include "batch_convert.h"
#include "pipetrain/error.h"

namespace pipetrain::python {

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
    mb.inputs = to_batch(item[py::int_(0)], "the inputs of data item " + std::to_string(index));
    mb.labels = to_batch(item[py::int_(1)], "the labels of data item " + std::to_string(index));
    return mb;
  });
}

}  // namespace pipetrain::python
