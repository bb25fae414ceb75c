// The data contract of training: an iterator of micro-batches (inputs and labels).
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "pipetrain/batch/batch.h"

namespace pipetrain {

// One micro-batch as a data source yields it. Under a pipeline only the first stage uses
// `inputs` and only the last uses `labels`; both stages iterate the same order.
struct MicroBatch {
  Batch inputs;
  Batch labels;
};

// A source of micro-batches; `next()` returns nullopt when it runs out.
class DataIterator {
 public:
  virtual ~DataIterator() = default;
  virtual std::optional<MicroBatch> next() = 0;
};

// Adapts a callable to DataIterator (handy in tests and examples).
class FunctionIterator final : public DataIterator {
 public:
  explicit FunctionIterator(std::function<std::optional<MicroBatch>()> fn) : fn_(std::move(fn)) {}
  std::optional<MicroBatch> next() override { return fn_(); }

 private:
  std::function<std::optional<MicroBatch>()> fn_;
};

}  // namespace pipetrain
