// The engine's fast path for Linear layers: input gradients now, weight gradients fused later.
#include "pipetrain/runtime/deferred_linear.h"

#include "pipetrain/error.h"

namespace pipetrain::runtime {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The autograd node of DeferredLinear::forward. Its backward returns only dx; dy goes to the
// layer's store for backward_weight. The layer outlives the graph (the stage owns both and
// frees graphs every step), so a raw pointer in saved_data is safe.
struct DeferredLinearFunction : torch::autograd::Function<DeferredLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x2d, torch::Tensor weight,
                               torch::Tensor bias, DeferredLinear* self, int64_t mb) {
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    ctx->saved_data["mb"] = mb;
    torch::Tensor y;
    if (self->native_eligible(x2d)) {
      y = native_linear(x2d, weight, bias);
    } else if (self->kernel_ == GemmKernel::OneDnn) {
      y = gemm(x2d, self->weight_transposed(), self->kernel_);
      if (bias.defined()) y.add_(bias);
    } else {
      y = bias.defined() ? torch::addmm(bias, x2d, weight.t()) : torch::mm(x2d, weight.t());
    }
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* self = reinterpret_cast<DeferredLinear*>(ctx->saved_data["self"].toInt());
    const int64_t mb = ctx->saved_data["mb"].toInt();
    const auto& dy = grad_outputs[0];
    self->grads_[mb] = dy;
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = self->native_eligible(dy) ? native_input_grad(dy, self->packed_weight())
                                               : gemm(dy, self->layer_->weight, self->kernel_);
    }
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

DeferredLinear::DeferredLinear(torch::nn::Linear layer, GemmKernel kernel)
    : layer_(std::move(layer)), kernel_(kernel) {}

const torch::Tensor& DeferredLinear::weight_transposed() {
  const auto& w = layer_->weight;
  if (!weight_t_.defined() || weight_t_version_ != static_cast<int64_t>(w._version()) ||
      weight_t_data_ != w.data_ptr()) {
    torch::NoGradGuard no_grad;
    weight_t_ = w.detach().t().contiguous();
    weight_t_version_ = static_cast<int64_t>(w._version());
    weight_t_data_ = w.data_ptr();
  }
  return weight_t_;
}

const PackedWeight& DeferredLinear::packed_weight() {
  const auto& w = layer_->weight;
  if (!packed_.defined() || packed_version_ != static_cast<int64_t>(w._version()) || packed_data_ != w.data_ptr()) {
    torch::NoGradGuard no_grad;
    packed_.pack(w);
    packed_version_ = static_cast<int64_t>(w._version());
    packed_data_ = w.data_ptr();
  }
  return packed_;
}

void DeferredLinear::weights_changed() {
  weight_t_version_ = -1;
  packed_version_ = -1;
}

void DeferredLinear::prepare_backward() {
  if (native_eligible(layer_->weight)) packed_weight();
}

bool DeferredLinear::native_eligible(const torch::Tensor& x) const {
  const auto& w = layer_->weight;
  return kernel_ == GemmKernel::Native && x.device().is_cpu() && w.device().is_cpu() &&
         x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat && x.layout() == torch::kStrided;
}

torch::Tensor DeferredLinear::forward(const torch::Tensor& x, int64_t mb) {
  const auto& weight = layer_->weight;
  const auto& bias = layer_->bias;
  const int64_t in = weight.size(1);
  if (x.dim() < 1 || x.size(-1) != in) {
    throw BatchError("Linear layer expects inputs of shape (..., " + std::to_string(in) + "), got " +
                     c10::str(x.sizes()));
  }
  if (x.scalar_type() != weight.scalar_type()) {
    throw BatchError(std::string("Linear layer expects ") + c10::toString(weight.scalar_type()) + " inputs, got " +
                     c10::toString(x.scalar_type()) + "; convert the batch (or the model) to one dtype");
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = weight.size(0);
  const auto x2d = x.reshape({-1, in});
  if (!torch::GradMode::is_enabled()) {
    if (native_eligible(x2d)) return native_linear(x2d, weight, bias).reshape(out_shape);
    torch::Tensor y = kernel_ == GemmKernel::OneDnn ? gemm(x2d, weight_transposed(), kernel_)
                                                    : torch::mm(x2d, weight.t());
    if (bias.defined()) y.add_(bias);
    return y.reshape(out_shape);
  }
  inputs_[mb] = x2d.detach();
  return DeferredLinearFunction::apply(x2d, weight, bias, this, mb).reshape(out_shape);
}

void DeferredLinear::backward_weight(const std::vector<int64_t>& mbs) {
  if (mbs.empty()) return;
  std::vector<torch::Tensor> xs, dys;
  for (int64_t mb : mbs) {
    auto x = inputs_.find(mb);
    auto dy = grads_.find(mb);
    if (x == inputs_.end() || dy == grads_.end()) {
      throw ScheduleError("weight gradient of micro-batch " + std::to_string(mb) +
                          " requested before its " + (x == inputs_.end() ? "forward" : "input-gradient backward") +
                          " ran on this Linear layer; the schedule must order F < B < W per micro-batch");
    }
    xs.push_back(x->second);
    dys.push_back(dy->second);
  }
  torch::NoGradGuard no_grad;
  const auto x = xs.size() == 1 ? xs.front() : torch::cat(xs);
  const auto dy = dys.size() == 1 ? dys.front() : torch::cat(dys);
  auto& weight = layer_->weight;
  // dW = dy^T x is "dx = dy W" with dy^T for dy and x for W: the same kernel, K = all rows.
  torch::Tensor dw;
  if (native_eligible(x) && native_eligible(dy)) {
    packed_inputs_.pack(x);
    dw = native_input_grad(dy.t().contiguous(), packed_inputs_);
  } else {
    dw = gemm(dy.t(), x, kernel_);
  }
  if (weight.grad().defined()) {
    weight.mutable_grad().add_(dw);
  } else {
    weight.mutable_grad() = dw;
  }
  auto& bias = layer_->bias;
  if (bias.defined()) {
    auto db = dy.sum(0);
    if (bias.grad().defined()) {
      bias.mutable_grad().add_(db);
    } else {
      bias.mutable_grad() = db;
    }
  }
  for (int64_t mb : mbs) forget(mb);
}

std::vector<int64_t> DeferredLinear::pending() const {
  std::vector<int64_t> mbs;
  for (const auto& [mb, _] : grads_) mbs.push_back(mb);
  return mbs;
}

void DeferredLinear::forget(int64_t mb) {
  inputs_.erase(mb);
  grads_.erase(mb);
}

void DeferredLinear::clear() {
  inputs_.clear();
  grads_.clear();
}

}  // namespace pipetrain::runtime
