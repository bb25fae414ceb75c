// A micro-batch value: one tensor, or a tuple of tensors passed between layers together.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace pipetrain {

// What flows between layers and stages. A layer with `forward(torch::Tensor)` receives an
// atomic batch; a layer with `forward(std::vector<torch::Tensor>)` receives a tuple, which may
// mix floating tensors (activations) with others (masks, token ids) that carry no gradient.
class Batch {
 public:
  Batch() = default;
  /*implicit*/ Batch(torch::Tensor tensor);                // NOLINT: atomic batch
  /*implicit*/ Batch(std::vector<torch::Tensor> tensors);  // NOLINT: tuple batch
  // An explicit tuple of one element (not atomic), for layers that take a vector of one.
  static Batch tuple(std::vector<torch::Tensor> tensors);
  // A tuple whose values may be undefined tensors (torchgpipe's None): the tensors of a skip
  // link, where an optional skip stashed nothing, and their gradients. Only skip traffic
  // carries one; the values between layers are always tensors (BatchError otherwise).
  static Batch tuple_with_none(std::vector<torch::Tensor> tensors);

  bool atomic() const { return atomic_; }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }

  // The tensor of an atomic batch; BatchError for a tuple.
  const torch::Tensor& tensor() const;
  torch::Tensor& tensor();
  const std::vector<torch::Tensor>& tensors() const { return values_; }
  std::vector<torch::Tensor>& tensors() { return values_; }
  const torch::Tensor& operator[](size_t i) const { return values_.at(i); }
  torch::Tensor& operator[](size_t i) { return values_.at(i); }

  // Rows along dim 0 (every tensor of a batch has the same count; undefined ones are skipped).
  int64_t rows() const;
  // The same kind of batch (atomic, tuple, or tuple with none) holding other tensors.
  Batch with(std::vector<torch::Tensor> tensors) const;
  // "Tensor[32, 1024] Float" or "(Tensor[4, 8] Float, Tensor[4, 8] Bool)", for messages.
  std::string describe() const;

 private:
  std::vector<torch::Tensor> values_;
  bool atomic_ = true;
  bool may_hold_none_ = false;  // made by tuple_with_none
};

// A layer that takes a batch of either form as it is and returns one (a layer written in
// Python, whose forward has no C++ signature to choose between): call_layer hands it the batch.
class BatchLayer {
 public:
  virtual ~BatchLayer() = default;
  virtual Batch forward_batch(const Batch& input) = 0;
};

// Runs one layer on a batch, choosing `forward(Tensor)` for an atomic batch and
// `forward(std::vector<Tensor>)` for a tuple; the layer may return either form. A layer whose
// signature does not fit raises BatchError naming the layer index, its name and the batch.
Batch call_layer(torch::nn::AnyModule& layer, const Batch& input, int64_t layer_index = -1);

}  // namespace pipetrain
