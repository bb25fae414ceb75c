// Micro-batches from one reader to its tensor-parallel group: a header of shapes, then the data.
#include "batch_broadcast.h"

#include <fmt/format.h>

#include "pipetrain/error.h"

namespace pipetrain::detail {
namespace {

// Per batch: atomic flag, tensor count; per tensor: dtype, rank, sizes.
void describe(const Batch& b, std::vector<int64_t>& h, std::vector<torch::Tensor>& data) {
  h.push_back(b.atomic() ? 1 : 0);
  h.push_back(static_cast<int64_t>(b.size()));
  for (const auto& t : b.tensors()) {
    if (!t.defined()) throw BatchError("a micro-batch from the data iterator holds an undefined tensor");
    h.push_back(static_cast<int64_t>(t.scalar_type()));
    h.push_back(t.dim());
    for (auto s : t.sizes()) h.push_back(s);
    data.push_back(t.contiguous());
  }
}

Batch allocate(const std::vector<int64_t>& h, size_t& at, std::vector<torch::Tensor>& data) {
  const bool atomic = h.at(at++) != 0;
  const auto n = h.at(at++);
  std::vector<torch::Tensor> tensors;
  for (int64_t i = 0; i < n; ++i) {
    const auto dtype = static_cast<c10::ScalarType>(h.at(at++));
    const auto dims = h.at(at++);
    std::vector<int64_t> sizes(h.begin() + static_cast<std::ptrdiff_t>(at),
                               h.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(dims)));
    at += static_cast<size_t>(dims);
    tensors.push_back(torch::empty(sizes, torch::TensorOptions().dtype(dtype)));
    data.push_back(tensors.back());
  }
  if (atomic && tensors.size() == 1) return Batch(tensors[0]);
  return Batch::tuple(std::move(tensors));
}

}  // namespace

std::vector<MicroBatch> broadcast_micro_batches(comm::Group& group, int root, bool is_root,
                                                std::vector<MicroBatch> batches, const std::string& root_error) {
  if (group.size() < 2) {
    if (!root_error.empty()) throw DataError(root_error);
    return batches;
  }
  std::vector<int64_t> h;
  std::vector<torch::Tensor> data;
  if (is_root && root_error.empty()) {
    h.push_back(static_cast<int64_t>(batches.size()));
    for (const auto& mb : batches) {
      describe(mb.inputs, h, data);
      describe(mb.labels, h, data);
    }
  }
  // The header's length first (-1: the root could not read), then the header, then the data.
  auto length = torch::tensor({is_root ? (root_error.empty() ? static_cast<int64_t>(h.size()) : int64_t{-1}) : 0},
                              torch::kInt64);
  std::vector<torch::Tensor> v{length};
  group.broadcast(v, root, "micro-batch header size");
  const int64_t n = length.item<int64_t>();
  if (n < 0) {
    throw DataError(is_root ? root_error
                            : fmt::format("rank {}, which reads this tensor-parallel group's micro-batches, ran out of "
                                          "data (see its error)",
                                          root));
  }
  auto header = is_root ? torch::tensor(h, torch::kInt64) : torch::empty({n}, torch::kInt64);
  v = {header};
  group.broadcast(v, root, "micro-batch header");
  if (!is_root) {
    const int64_t* p = header.data_ptr<int64_t>();
    h.assign(p, p + n);
    size_t at = 0;
    const auto count = h.at(at++);
    batches.clear();
    for (int64_t i = 0; i < count; ++i) {
      Batch inputs = allocate(h, at, data);
      Batch labels = allocate(h, at, data);
      batches.push_back(MicroBatch{std::move(inputs), std::move(labels)});
    }
  }
  group.broadcast(data, root, "micro-batches");
  return batches;
}

}  // namespace pipetrain::detail
