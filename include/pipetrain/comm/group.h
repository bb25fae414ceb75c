// Collectives over a process group: bucketed in-place all-reduce, broadcast, barrier and
// scalar all-reduce, each bounded by the communication timeout.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::comm {

enum class ReduceOp { Sum, Avg, Max, Min };
std::string to_string(ReduceOp op);

// Tensors of one dtype whose bytes add up to about the bucket size, flattened together.
struct Bucket {
  c10::ScalarType dtype;
  std::vector<size_t> indices;  // into the caller's tensor list, in order
  int64_t numel = 0;
};

// Groups `tensors` by dtype, in order, into buckets of at most `bucket_bytes` (a tensor
// larger than that gets a bucket of its own). Zero-element tensors are left out.
std::vector<Bucket> plan_buckets(const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes);

class Group {
 public:
  virtual ~Group() = default;

  // "dp/stage1"
  virtual const std::string& name() const = 0;
  // Global ranks of the members, ascending; this rank is one of them.
  virtual const std::vector<int>& ranks() const = 0;
  int size() const { return static_cast<int>(ranks().size()); }
  // Index of a global rank among the members; ConfigError when it is not one.
  int index_of(int global_rank) const;

  // Reduces `tensors` element-wise across the members, in place, every member passing
  // tensors of the same count, dtypes and sizes. Buckets of options().bucket_bytes are
  // flattened (no copy for a bucket that is one contiguous tensor). Avg needs floating
  // tensors. `what` names the operation in errors ("gradients of stage 1").
  void all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op = ReduceOp::Sum,
                  const std::string& what = "all-reduce");
  // Copies the tensors of member `root` (a global rank) into every member's tensors.
  void broadcast(std::vector<torch::Tensor>& tensors, int root,
                 const std::string& what = "broadcast");
  // Reduces one number (in double precision), e.g. a loss or a squared gradient norm.
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::Sum,
                           const std::string& what = "scalar all-reduce");
  // Every member's `part` (the same sizes and dtype on every member), stacked in member order:
  // [size(), part sizes...]. Moves each part once, unlike an all-reduce of a padded buffer.
  torch::Tensor all_gather(const torch::Tensor& part, const std::string& what = "all-gather");
  // Returns once every member has entered the barrier.
  virtual void barrier(const std::string& what = "barrier") = 0;

 protected:
  virtual int64_t bucket_bytes() const = 0;
  // One contiguous tensor of one dtype, reduced in place (Sum, Max or Min).
  virtual void all_reduce_flat(torch::Tensor& flat, ReduceOp op, const std::string& what) = 0;
  // One contiguous tensor, overwritten by member `root_index`'s.
  virtual void broadcast_flat(torch::Tensor& flat, int root_index, const std::string& what) = 0;
  // `out` (size() x flat.numel(), contiguous, flat's dtype) gets every member's `flat` by index.
  virtual void all_gather_flat(const torch::Tensor& flat, torch::Tensor& out, const std::string& what) = 0;

 private:
  template <typename Fn>
  void for_each_bucket(std::vector<torch::Tensor>& tensors, bool write_back, Fn&& fn);
};

// "all-reduce (Sum) over group dp/stage1 [ranks 1, 3]" — the tail of collective errors.
std::string describe_group(const Group& group);

}  // namespace pipetrain::comm
