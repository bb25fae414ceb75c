// Copies between devices on copy streams, as autograd functions (see stream_copy.h).
#include "pipetrain/runtime/stream_copy.h"

#include <torch/torch.h>

#include "differentiable.h"
#include "pipetrain/runtime/stream.h"

namespace pipetrain::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The two streams of a step, kept by the autograd node for its backward.
struct StreamPair : torch::CustomClassHolder {
  StreamPair(c10::Stream a, c10::Stream b) : first(a), second(b) {}
  c10::Stream first;
  c10::Stream second;
};

c10::intrusive_ptr<StreamPair> pair_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<StreamPair>(ctx->saved_data["streams"].toCapsule());
}

using detail::differentiable;

// xs (produced on `from`) copied to `to`'s device on stream `to`.
variable_list copy_tensors(const variable_list& xs, const c10::Stream& from, const c10::Stream& to) {
  // The stream that will use the copies once the copy is done: current on `to`'s device now.
  const c10::Stream user = current_stream(to.device());
  variable_list ys;
  ys.reserve(xs.size());
  StreamScope on_from(from);
  StreamScope on_to(to);
  wait_stream(to, from);  // the copy reads what `from` wrote
  for (const auto& x : xs) {
    if (!x.defined()) {
      ys.emplace_back();
      continue;
    }
    torch::Tensor y = x.to(to.device(), /*non_blocking=*/true);
    record_stream(Batch(x), from);  // read on `to` while `from` owns it: keep it until then
    record_stream(Batch(y), user);  // allocated on `to`, used on `user`
    ys.push_back(std::move(y));
  }
  return ys;
}

struct CopyFunction : torch::autograd::Function<CopyFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<StreamPair> streams, at::TensorList xs) {
    variable_list ys = copy_tensors(xs.vec(), streams->first, streams->second);
    ctx->saved_data["streams"] = c10::IValue::make_capsule(std::move(streams));
    return ys;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto streams = pair_of(ctx);
    variable_list out{torch::Tensor()};  // the streams
    for (auto& g : copy_tensors(grads, streams->second, streams->first)) out.push_back(std::move(g));
    return out;
  }
};

struct WaitFunction : torch::autograd::Function<WaitFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<StreamPair> streams, at::TensorList xs) {
    wait_stream(streams->second, streams->first);  // compute after copy
    ctx->saved_data["streams"] = c10::IValue::make_capsule(std::move(streams));
    return xs.vec();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto streams = pair_of(ctx);
    wait_stream(streams->first, streams->second);  // the copy back after compute's backward
    variable_list out{torch::Tensor()};
    for (auto& g : grads) out.push_back(std::move(g));
    return out;
  }
};

// Runs `fn` over the differentiable tensors as one autograd node; the others go `plain`.
template <typename Node, typename Plain>
Batch apply_split(const Batch& batch, const c10::Stream& a, const c10::Stream& b, Plain plain) {
  variable_list grads_in;
  std::vector<size_t> where;
  for (size_t k = 0; k < batch.size(); ++k) {
    if (differentiable(batch[k])) {
      grads_in.push_back(batch[k]);
      where.push_back(k);
    }
  }
  std::vector<torch::Tensor> out(batch.size());
  if (!grads_in.empty()) {
    const auto ys = Node::apply(c10::make_intrusive<StreamPair>(a, b), at::TensorList(grads_in));
    for (size_t n = 0; n < where.size(); ++n) out[where[n]] = ys[n];
  }
  for (size_t k = 0; k < batch.size(); ++k) {
    if (!differentiable(batch[k])) out[k] = plain(batch[k]);
  }
  return batch.with(std::move(out));
}

}  // namespace

Batch copy_on_stream(const Batch& batch, const c10::Stream& from, const c10::Stream& to) {
  return apply_split<CopyFunction>(batch, from, to, [&](const torch::Tensor& t) {
    return t.defined() ? copy_tensors({t}, from, to)[0] : t;
  });
}

Batch wait_for_copy(const Batch& batch, const c10::Stream& copy, const c10::Stream& compute) {
  return apply_split<WaitFunction>(batch, copy, compute, [&](const torch::Tensor& t) {
    wait_stream(compute, copy);
    return t;
  });
}

}  // namespace pipetrain::runtime
