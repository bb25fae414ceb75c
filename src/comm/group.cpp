// Collectives over a process group: bucketing shared by every implementation.
#include "pipetrain/comm/group.h"

#include <algorithm>

#include "pipetrain/error.h"

namespace pipetrain::comm {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Avg: return "Avg";
    case ReduceOp::Max: return "Max";
    case ReduceOp::Min: return "Min";
  }
  return "?";
}

std::vector<Bucket> plan_buckets(const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes) {
  std::vector<Bucket> done;
  std::vector<Bucket> open;  // one open bucket per dtype, in order of first appearance
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (t.numel() == 0) continue;
    const auto dtype = t.scalar_type();
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    auto it = std::find_if(open.begin(), open.end(), [&](const Bucket& b) { return b.dtype == dtype; });
    if (it != open.end()) {
      const int64_t used = it->numel * static_cast<int64_t>(t.element_size());
      if (used + bytes > bucket_bytes) {
        done.push_back(std::move(*it));
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      open.push_back({dtype, {}, 0});
      it = std::prev(open.end());
    }
    it->indices.push_back(i);
    it->numel += t.numel();
  }
  for (auto& b : open) done.push_back(std::move(b));
  // Every member plans the same list, so any fixed order works; keep first-index order.
  std::sort(done.begin(), done.end(),
            [](const Bucket& a, const Bucket& b) { return a.indices.front() < b.indices.front(); });
  return done;
}

int Group::index_of(int global_rank) const {
  const auto& r = ranks();
  auto it = std::lower_bound(r.begin(), r.end(), global_rank);
  if (it == r.end() || *it != global_rank) {
    throw ConfigError("rank " + std::to_string(global_rank) + " is not a member of group " +
                      describe_group(*this));
  }
  return static_cast<int>(it - r.begin());
}

template <typename Fn>
void Group::for_each_bucket(std::vector<torch::Tensor>& tensors, bool write_back, Fn&& fn) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      throw BatchError("tensor " + std::to_string(i) + " passed to a collective over " +
                       describe_group(*this) + " is undefined");
    }
  }
  torch::NoGradGuard no_grad;  // parameters (leaves requiring grad) are written in place
  for (const Bucket& bucket : plan_buckets(tensors, bucket_bytes())) {
    if (bucket.indices.size() == 1 && tensors[bucket.indices[0]].is_contiguous()) {
      torch::Tensor flat = tensors[bucket.indices[0]].view({-1});
      fn(flat);
      continue;
    }
    std::vector<torch::Tensor> pieces;
    pieces.reserve(bucket.indices.size());
    for (size_t i : bucket.indices) pieces.push_back(tensors[i].reshape({-1}));
    torch::Tensor flat = torch::cat(pieces);
    fn(flat);
    if (!write_back) continue;
    int64_t offset = 0;
    for (size_t i : bucket.indices) {
      const int64_t n = tensors[i].numel();
      tensors[i].copy_(flat.narrow(0, offset, n).view(tensors[i].sizes()));
      offset += n;
    }
  }
}

void Group::all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op, const std::string& what) {
  if (op == ReduceOp::Avg) {
    for (const auto& t : tensors) {
      if (t.defined() && !t.is_floating_point()) {
        throw BatchError(what + ": ReduceOp::Avg needs floating tensors, got " +
                         std::string(c10::toString(t.scalar_type())) + "; use Sum and divide");
      }
    }
  }
  const ReduceOp wire = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  for_each_bucket(tensors, true, [&](torch::Tensor& flat) {
    all_reduce_flat(flat, wire, what);
    if (op == ReduceOp::Avg) flat.div_(size());
  });
}

void Group::broadcast(std::vector<torch::Tensor>& tensors, int root, const std::string& what) {
  const int root_index = index_of(root);
  for_each_bucket(tensors, true, [&](torch::Tensor& flat) { broadcast_flat(flat, root_index, what); });
}

torch::Tensor Group::all_gather(const torch::Tensor& part, const std::string& what) {
  const torch::Tensor flat = part.detach().contiguous().view({-1});
  auto sizes = part.sizes().vec();
  sizes.insert(sizes.begin(), size());
  torch::Tensor out = torch::empty({size(), flat.numel()}, flat.options());
  if (flat.numel() > 0) all_gather_flat(flat, out, what);
  return out.view(sizes);
}

double Group::all_reduce_scalar(double value, ReduceOp op, const std::string& what) {
  torch::Tensor t = torch::full({1}, value, torch::kFloat64);
  all_reduce_flat(t, op == ReduceOp::Avg ? ReduceOp::Sum : op, what);
  double result = t.item<double>();
  return op == ReduceOp::Avg ? result / size() : result;
}

std::string describe_group(const Group& group) {
  std::string text = "group " + group.name() + " [rank";
  const auto& r = group.ranks();
  text += r.size() == 1 ? " " : "s ";
  for (size_t i = 0; i < r.size(); ++i) text += (i ? ", " : "") + std::to_string(r[i]);
  return text + "]";
}

}  // namespace pipetrain::comm
