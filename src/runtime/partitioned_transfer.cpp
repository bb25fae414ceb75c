// Each tensor-parallel rank sends a 1/T part of an activation or gradient; the receivers
// all-gather the parts.
#include "pipetrain/runtime/partitioned_transfer.h"

#include <fmt/format.h>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

enum Kind : int64_t { kAtomic = 0, kTuple = 1, kTupleWithNone = 2 };

int64_t part_size(int64_t numel, int size) { return (numel + size - 1) / size; }

}  // namespace

Batch partition_for_send(const Batch& batch, const TensorParallelGroup& group) {
  if (!group.active()) return batch;
  std::vector<int64_t> header;
  bool has_none = false;
  for (const auto& t : batch.tensors()) has_none |= !t.defined();
  header.push_back(batch.atomic() ? kAtomic : has_none ? kTupleWithNone : kTuple);
  header.push_back(static_cast<int64_t>(batch.size()));
  std::vector<torch::Tensor> out{torch::Tensor()};  // the header, filled in below
  for (const auto& t : batch.tensors()) {
    if (!t.defined()) {
      header.push_back(-1);
      continue;
    }
    header.push_back(t.dim());
    for (auto s : t.sizes()) header.push_back(s);
    header.push_back(t.requires_grad() ? 1 : 0);
    const int64_t n = t.numel(), part = part_size(n, group.size);
    auto flat = t.detach().reshape({-1});
    const int64_t begin = std::min(n, part * group.rank), end = std::min(n, begin + part);
    auto mine = torch::zeros({part}, flat.options());
    if (end > begin) mine.narrow(0, 0, end - begin).copy_(flat.narrow(0, begin, end - begin));
    out.push_back(mine);
  }
  out[0] = torch::tensor(header, torch::kInt64);
  return Batch::tuple(std::move(out));
}

Batch assemble_received(const Batch& parts, const TensorParallelGroup& group) {
  if (!group.active()) return parts;
  const auto header_tensor = parts[0].to(torch::kCPU).contiguous();
  const int64_t* h = header_tensor.data_ptr<int64_t>();
  const int64_t length = header_tensor.numel();
  int64_t at = 0;
  auto next = [&] {
    if (at >= length) throw BatchError("a partitioned transfer's header is cut short");
    return h[at++];
  };
  const int64_t kind = next(), count = next();
  std::vector<torch::Tensor> tensors;
  size_t part_index = 1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t dims = next();
    if (dims < 0) {
      tensors.emplace_back();
      continue;
    }
    std::vector<int64_t> sizes;
    for (int64_t d = 0; d < dims; ++d) sizes.push_back(next());
    const bool requires_grad = next() != 0;
    const auto& part = parts[part_index++];
    int64_t n = 1;
    for (auto s : sizes) n *= s;
    ShardLayout layout;
    layout.dim = 0;
    layout.full_size = part.numel() * group.size;
    layout.rank = group.rank;
    layout.size = group.size;
    if (part.numel() != part_size(n, group.size)) {
      throw BatchError(fmt::format("a partitioned transfer's part holds {} values, expected {} of a tensor of {}",
                                   part.numel(), part_size(n, group.size), n));
    }
    auto full = gather_shards(part.detach(), layout, group).narrow(0, 0, n).reshape(sizes).contiguous();
    tensors.push_back(requires_grad ? full.requires_grad_(true) : full);
  }
  if (kind == kAtomic && tensors.size() == 1) return Batch(tensors[0]);
  if (kind == kTupleWithNone) return Batch::tuple_with_none(std::move(tensors));
  return Batch::tuple(std::move(tensors));
}

}  // namespace pipetrain::runtime
