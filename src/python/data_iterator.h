// A Python iterator of (inputs, labels) as the engine's data source.
#pragma once

#include <torch/extension.h>

#include <optional>

#include "pipetrain/batch/data_iterator.h"
#include "py_ref.h"

namespace pipetrain::python {

// Each item is one micro-batch: a pair (inputs, labels), each a tensor or a tuple of tensors, as
// DeepSpeed's pipeline engine takes them (a Python number as a 0-d tensor). A StopIteration reaches the caller of train_batch as
// itself (a DeepSpeed training loop may end on it); a malformed item is a DataError naming it.
class PyDataIterator final : public DataIterator {
 public:
  // BatchError (TypeError in Python) when `iterator` is not an iterator. Under the GIL.
  explicit PyDataIterator(py::object iterator);
  std::optional<MicroBatch> next() override;

 private:
  PyRef iterator_;
  int64_t items_ = 0;
};

}  // namespace pipetrain::python
