// Tensor-parallel groups, Megatron's communication functions, sharded-parameter records and the
// vocabulary-parallel cross-entropy.
#include "pipetrain/runtime/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "pipetrain/error.h"
#include "pipetrain/runtime/rng.h"

namespace pipetrain::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local TensorParallelGroup current_group;

// A custom function's context keeps the group as a pointer: the layers that call these functions
// own the group and outlive their backward.
void save_group(AutogradContext* ctx, const TensorParallelGroup& g) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(g.group.get());
  ctx->saved_data["rank"] = static_cast<int64_t>(g.rank);
  ctx->saved_data["size"] = static_cast<int64_t>(g.size);
}

comm::Group& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
}

torch::Tensor all_reduced(const torch::Tensor& x, comm::Group& group, comm::ReduceOp op, const char* what) {
  runtime::LeaseSuspension let_others_lease;  // the group's other ranks may be threads mid-forward
  std::vector<torch::Tensor> v{x.detach().contiguous().clone()};
  group.all_reduce(v, op, what);
  return v[0];
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const TensorParallelGroup& g) {
    save_group(ctx, g);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], group_of(ctx), comm::ReduceOp::Sum, "tensor-parallel input gradient"),
            torch::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, const TensorParallelGroup& g) {
    return all_reduced(x, *g.group, comm::ReduceOp::Sum, "tensor-parallel partial sums");
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], torch::Tensor()}; }
};

ShardLayout last_dim_even(const torch::Tensor& x, int rank, int size) {
  ShardLayout l;
  l.dim = x.dim() - 1;
  l.full_size = x.size(-1) * size;
  l.rank = rank;
  l.size = size;
  return l;
}

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const TensorParallelGroup& g) {
    save_group(ctx, g);
    return gather_shards(x, last_dim_even(x, g.rank, g.size), g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int rank = static_cast<int>(ctx->saved_data["rank"].toInt());
    const int size = static_cast<int>(ctx->saved_data["size"].toInt());
    const int64_t part = grads[0].size(-1) / size;
    return {grads[0].narrow(-1, rank * part, part).contiguous(), torch::Tensor()};
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t vocab_begin, const TensorParallelGroup& g) {
    torch::NoGradGuard no_grad;
    const auto x = logits.to(torch::kFloat);
    const int64_t part = x.size(-1);
    auto max = all_reduced(std::get<0>(x.max(-1)), *g.group, comm::ReduceOp::Max, "vocab-parallel max logit");
    auto shifted = x - max.unsqueeze(-1);
    const auto in_range = (targets >= vocab_begin) & (targets < vocab_begin + part);
    const auto local = (targets - vocab_begin).clamp(0, part - 1).masked_fill(~in_range, 0);
    auto picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * in_range.to(torch::kFloat);
    picked = all_reduced(picked, *g.group, comm::ReduceOp::Sum, "vocab-parallel target logit");
    auto exp = shifted.exp();
    auto sum = all_reduced(exp.sum(-1), *g.group, comm::ReduceOp::Sum, "vocab-parallel softmax sum");
    ctx->save_for_backward({exp.div_(sum.unsqueeze(-1)), local, in_range});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return sum.log() - picked;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto grad = saved[0].clone();  // softmax
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), -saved[2].to(grad.dtype()).unsqueeze(-1));
    grad.mul_(grads[0].unsqueeze(-1));
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Shard records: by TensorImpl, with a weak reference so that a freed parameter's address,
// reused by another tensor, is not taken for it.
struct Record {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
  ShardLayout layout;
};
std::mutex records_mutex;
std::unordered_map<const c10::TensorImpl*, Record>& records() {
  static std::unordered_map<const c10::TensorImpl*, Record> r;
  return r;
}

}  // namespace

const TensorParallelGroup& current_tensor_parallel() { return current_group; }

TensorParallelScope::TensorParallelScope(TensorParallelGroup group) : saved_(current_group) {
  if (group.size < 1 || group.rank < 0 || group.rank >= group.size || (group.size > 1 && !group.group)) {
    throw UsageError(fmt::format("tensor-parallel rank {} of {} needs a group of that size", group.rank, group.size));
  }
  current_group = std::move(group);
}

TensorParallelScope::~TensorParallelScope() { current_group = saved_; }

at::Generator make_sharded_generator(uint64_t seed, int rank) {
  // Megatron offsets its model-parallel seed by 2718 + rank; splitmix keeps the streams apart.
  return make_generator(task_seed(seed, 2718, rank));
}

ShardedRandomScope::ShardedRandomScope() {
  const auto& rng = current_group.sharded_rng;
  if (rng.defined()) scope_.emplace(rng);
}

std::pair<int64_t, int64_t> ShardLayout::range_of(int r, int64_t chunk) const {
  const int64_t chunk_size = full_size / stride;
  const int64_t base = chunk * chunk_size;
  return {base + chunk_size * r / size, base + chunk_size * (r + 1) / size};
}

torch::Tensor ShardLayout::slice(const torch::Tensor& full) const {
  if (full.size(dim) != full_size || full_size % stride != 0 || full_size / stride < size) {
    throw ConfigError(fmt::format("cannot cut a tensor of size {} along dim {} into {} x {} tensor-parallel parts of "
                                 "a full size {}",
                                 full.size(dim), dim, stride, size, full_size));
  }
  std::vector<torch::Tensor> parts;
  for (int64_t c = 0; c < stride; ++c) {
    const auto [b, e] = range(c);
    parts.push_back(full.narrow(dim, b, e - b));
  }
  return torch::cat(parts, dim).contiguous();
}

void mark_sharded(const torch::Tensor& param, const ShardLayout& layout) {
  std::lock_guard<std::mutex> lock(records_mutex);
  auto& r = records();
  // Drop records of freed tensors now and then, so the table does not grow with every model.
  if (r.size() > 4096) {
    for (auto it = r.begin(); it != r.end();) it = it->second.tensor.expired() ? r.erase(it) : std::next(it);
  }
  r.insert_or_assign(param.unsafeGetTensorImpl(),
                    Record{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(param.getIntrusivePtr()),
                           layout});
}

std::optional<ShardLayout> shard_layout(const torch::Tensor& param) {
  std::lock_guard<std::mutex> lock(records_mutex);
  const auto it = records().find(param.unsafeGetTensorImpl());
  if (it == records().end()) return std::nullopt;
  auto alive = it->second.tensor.lock();
  if (!alive || alive.get() != param.unsafeGetTensorImpl()) return std::nullopt;
  return it->second.layout;
}

torch::Tensor gather_shards(const torch::Tensor& part, const ShardLayout& layout, const TensorParallelGroup& group) {
  if (!group.active()) return part;
  const int64_t dim = layout.dim;
  auto length = [&](int r, int64_t c) {
    const auto [b, e] = layout.range_of(r, c);
    return e - b;
  };
  std::vector<int64_t> slice_length(static_cast<size_t>(layout.size), 0);
  for (int r = 0; r < layout.size; ++r) {
    for (int64_t c = 0; c < layout.stride; ++c) slice_length[static_cast<size_t>(r)] += length(r, c);
  }
  const int64_t longest = *std::max_element(slice_length.begin(), slice_length.end());
  torch::NoGradGuard no_grad;
  // The gather needs equal parts: a rank whose slice is shorter (uneven split) pads it.
  torch::Tensor padded = part;
  if (part.size(dim) < longest) {
    auto sizes = part.sizes().vec();
    sizes[static_cast<size_t>(dim)] = longest - part.size(dim);
    padded = torch::cat({part, torch::zeros(sizes, part.options())}, dim);
  }
  torch::Tensor slices;
  {
    LeaseSuspension let_others_lease;
    slices = group.group->all_gather(padded, "tensor-parallel all-gather");  // [size, ...]
  }
  // Chunk by chunk, every rank's part of it in rank order.
  std::vector<torch::Tensor> pieces;
  std::vector<int64_t> offset(static_cast<size_t>(layout.size), 0);
  for (int64_t c = 0; c < layout.stride; ++c) {
    for (int r = 0; r < layout.size; ++r) {
      pieces.push_back(slices[r].narrow(dim, offset[static_cast<size_t>(r)], length(r, c)));
      offset[static_cast<size_t>(r)] += length(r, c);
    }
  }
  return torch::cat(pieces, dim);
}

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& group) {
  return group.active() ? CopyToRegion::apply(x, group) : x;
}

torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& group) {
  return group.active() ? ReduceFromRegion::apply(x, group) : x;
}

torch::Tensor gather_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& group) {
  return group.active() ? GatherFromRegion::apply(x, group) : x;
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_begin, const TensorParallelGroup& group) {
  if (!group.active()) {
    return torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  }
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_begin, group);
}

}  // namespace pipetrain::runtime
