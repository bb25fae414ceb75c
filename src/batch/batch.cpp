// A micro-batch value: one tensor, or a tuple of tensors passed between layers together.
#include "pipetrain/batch/batch.h"

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

std::string describe_tensor(const torch::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::ostringstream out;
  out << "Tensor" << t.sizes() << " " << c10::toString(t.scalar_type());
  return out.str();
}

void check_defined(const std::vector<torch::Tensor>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].defined()) {
      throw BatchError("batch value " + std::to_string(i) +
                       " is an undefined tensor; every value between layers must be a tensor "
                       "(pass masks and ids as tensors, not as empty placeholders)");
    }
  }
}

}  // namespace

Batch::Batch(torch::Tensor tensor) : values_{std::move(tensor)}, atomic_(true) {
  check_defined(values_);
}

Batch::Batch(std::vector<torch::Tensor> tensors) : values_(std::move(tensors)), atomic_(false) {
  check_defined(values_);
}

Batch Batch::tuple(std::vector<torch::Tensor> tensors) { return Batch(std::move(tensors)); }

Batch Batch::tuple_with_none(std::vector<torch::Tensor> tensors) {
  Batch b;
  b.values_ = std::move(tensors);
  b.atomic_ = false;
  b.may_hold_none_ = true;
  return b;
}

const torch::Tensor& Batch::tensor() const {
  if (!atomic_) {
    throw BatchError("expected a single tensor but the batch is a tuple " + describe() +
                     "; use tensors() or make the last layer return one tensor");
  }
  return values_.front();
}

torch::Tensor& Batch::tensor() {
  return const_cast<torch::Tensor&>(static_cast<const Batch*>(this)->tensor());
}

int64_t Batch::rows() const {
  for (const auto& t : values_) {
    if (t.defined()) return t.dim() == 0 ? 0 : t.size(0);
  }
  return 0;
}

Batch Batch::with(std::vector<torch::Tensor> tensors) const {
  if (may_hold_none_) return tuple_with_none(std::move(tensors));
  if (atomic_) {
    if (tensors.size() != 1) {
      throw BatchError("an atomic batch holds one tensor, got " + std::to_string(tensors.size()));
    }
    return Batch(std::move(tensors.front()));
  }
  return Batch(std::move(tensors));
}

std::string Batch::describe() const {
  if (atomic_ && values_.size() == 1) return describe_tensor(values_.front());
  std::string out = "(";
  for (size_t i = 0; i < values_.size(); ++i) {
    if (i) out += ", ";
    out += describe_tensor(values_[i]);
  }
  return out + ")";
}

Batch call_layer(torch::nn::AnyModule& layer, const Batch& input, int64_t layer_index) {
  if (auto* batch_layer = dynamic_cast<BatchLayer*>(layer.ptr().get())) return batch_layer->forward_batch(input);
  torch::nn::AnyValue output = [&] {
    try {
      if (input.atomic()) return layer.any_forward(input.tensor());
      return layer.any_forward(input.tensors());
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      // AnyModule reports a signature mismatch as "Expected argument #0 to be of type ...".
      if (what.find("Expected argument") == std::string::npos) throw;
      throw BatchError("layer " + std::to_string(layer_index) + " (" + layer.ptr()->name() +
                       ") cannot take " + input.describe() + ": " + what +
                       ". A layer that receives several tensors must take "
                       "std::vector<torch::Tensor>; one that receives one tensor takes torch::Tensor");
    }
  }();
  if (auto* t = output.try_get<torch::Tensor>()) return Batch(*t);
  if (auto* v = output.try_get<std::vector<torch::Tensor>>()) return Batch(*v);
  throw BatchError("layer " + std::to_string(layer_index) + " (" + layer.ptr()->name() +
                   ") returned a value that is neither torch::Tensor nor "
                   "std::vector<torch::Tensor>; pipeline layers must return tensors");
}

}  // namespace pipetrain
