// The engine's fast path for Linear layers: input gradients now, weight gradients fused later.
#include "pipetrain/runtime/deferred_linear.h"

#include <algorithm>

#include "pipetrain/error.h"
#include "pipetrain/runtime/autocast.h"

namespace pipetrain::runtime {

namespace {
// Rows of dW per block of the native accumulator: 1/8 of a 1024-feature layer, about 0.7 ms
// for 256 rows of micro-batches on one core, the longest a wait-filling piece may delay the
// message it waited for.
constexpr int64_t kBlockRows = 128;
}  // namespace

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The autograd node of DeferredLinear::forward. Its backward returns only dx; dy goes to the
// layer's store for backward_weight. The layer outlives the graph (the stage owns both and
// frees graphs every step), so a raw pointer in saved_data is safe.
struct DeferredLinearFunction : torch::autograd::Function<DeferredLinearFunction> {
  // The bias is read from the layer, not passed: LibTorch 1.13's apply() fails on an undefined
  // tensor argument ("tensor does not have a device"), which a Linear without bias has.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x2d, torch::Tensor weight,
                               DeferredLinear* self, int64_t mb) {
    const torch::Tensor& bias = self->layer_->bias;
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    ctx->saved_data["mb"] = mb;
    torch::Tensor y;
    if (x2d.scalar_type() != weight.scalar_type()) {  // autocast's dtype (forward cast x to it)
      y = self->low_precision_linear(x2d);
    } else if (self->native_eligible(x2d)) {
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
    self->input_gradient_done(mb, dy);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      if (dy.scalar_type() != self->layer_->weight.scalar_type()) {
        dx = self->native_bf16_eligible(dy) ? native_input_grad_bf16(dy, self->packed_lowp_weight())
                                            : torch::mm(dy, self->weight_in(dy.scalar_type()));
      } else {
        dx = self->native_eligible(dy) ? native_input_grad(dy, self->packed_weight())
                                       : gemm(dy, self->layer_->weight, self->kernel_);
      }
    }
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

DeferredLinear::DeferredLinear(torch::nn::Linear layer, GemmKernel kernel)
    : layer_(std::move(layer)), kernel_(kernel) {
  // Asked for by value (not by parse_gemm_kernel), so checked here: elsewhere it is a SIGILL.
  if (kernel_ == GemmKernel::Native && !native_gemm_available()) {
    throw ConfigError("DeferredLinear: GemmKernel::Native needs AVX-512F, or AVX2 and FMA, which are off here: " +
                      native_gemm_summary() + "; pass parse_gemm_kernel(\"auto\") or GemmKernel::Blas / OneDnn");
  }
}

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

const PackedPairs& DeferredLinear::packed_lowp_weight() {
  const auto& w = layer_->weight;
  if (!packed_lowp_.defined() || packed_lowp_version_ != static_cast<int64_t>(w._version()) ||
      packed_lowp_data_ != w.data_ptr()) {
    packed_lowp_.pack(weight_in(torch::kBFloat16));
    packed_lowp_version_ = static_cast<int64_t>(w._version());
    packed_lowp_data_ = w.data_ptr();
  }
  return packed_lowp_;
}

torch::Tensor DeferredLinear::low_precision_linear(const torch::Tensor& x2d) {
  const auto& w = weight_in(x2d.scalar_type());
  const auto& bias = layer_->bias;
  // The bias stays float32 on the native kernel: added to the float32 sums before the one rounding.
  if (native_bf16_eligible(x2d)) return native_linear_bf16(x2d, w, bias);
  return bias.defined() ? torch::addmm(bias.to(x2d.scalar_type()), x2d, w.t()) : torch::mm(x2d, w.t());
}

const torch::Tensor& DeferredLinear::weight_in(c10::ScalarType dtype) {
  const auto& w = layer_->weight;
  if (!weight_lowp_.defined() || weight_lowp_.scalar_type() != dtype ||
      weight_lowp_version_ != static_cast<int64_t>(w._version()) || weight_lowp_data_ != w.data_ptr()) {
    torch::NoGradGuard no_grad;
    weight_lowp_ = w.detach().to(dtype);
    weight_lowp_version_ = static_cast<int64_t>(w._version());
    weight_lowp_data_ = w.data_ptr();
  }
  return weight_lowp_;
}

void DeferredLinear::weights_changed() {
  weight_lowp_version_ = -1;
  weight_t_version_ = -1;
  packed_version_ = -1;
  packed_lowp_version_ = -1;
}

void DeferredLinear::prepare_backward() {
  // Under bf16 autocast the bf16 kernels' copies of W (row-major for the forward, pairs for the
  // input gradient) are what backward reads, not the float32 packing.
  if (autocast_dtype(layer_->weight.device()) == torch::kBFloat16 && bf16_kernels_on()) {
    packed_lowp_weight();
  } else if (native_eligible(layer_->weight)) {
    packed_weight();
  }
}

bool DeferredLinear::bf16_kernels_on() const {
  const auto& w = layer_->weight;
  return kernel_ == GemmKernel::Native && w.device().is_cpu() && w.scalar_type() == torch::kFloat &&
         native_bf16_available();
}

bool DeferredLinear::native_bf16_eligible(const torch::Tensor& x) const {
  return x.device().is_cpu() && x.scalar_type() == torch::kBFloat16 && x.layout() == torch::kStrided &&
         bf16_kernels_on();
}

bool DeferredLinear::frozen() const {
  return !layer_->weight.requires_grad() || (layer_->bias.defined() && !layer_->bias.requires_grad());
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
  // Autocast's compute dtype: a float32 input (the first layer's) is cast to it here, as
  // autocast's own Linear would (the cast is differentiable, so dx comes back in float32).
  const auto compute = autocast_dtype(x.device());
  const bool low = compute != weight.scalar_type() && weight.scalar_type() == torch::kFloat &&
                   (x.scalar_type() == torch::kFloat || x.scalar_type() == compute);
  if (!low && x.scalar_type() != weight.scalar_type()) {
    throw BatchError(std::string("Linear layer expects ") + c10::toString(weight.scalar_type()) + " inputs, got " +
                     c10::toString(x.scalar_type()) + "; convert the batch (or the model) to one dtype");
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = weight.size(0);
  const auto x2d = low ? x.reshape({-1, in}).to(compute) : x.reshape({-1, in});
  if (low && !torch::GradMode::is_enabled()) return low_precision_linear(x2d).reshape(out_shape);
  if (!torch::GradMode::is_enabled()) {
    if (native_eligible(x2d)) return native_linear(x2d, weight, bias).reshape(out_shape);
    torch::Tensor y = kernel_ == GemmKernel::OneDnn ? gemm(x2d, weight_transposed(), kernel_)
                                                    : torch::mm(x2d, weight.t());
    if (bias.defined()) y.add_(bias);
    return y.reshape(out_shape);
  }
  if (frozen()) {
    const auto w = low ? weight.to(compute) : weight;
    const auto b = low && bias.defined() ? bias.to(compute) : bias;
    return torch::linear(x2d, w, b).reshape(out_shape);
  }
  inputs_[mb] = x2d.detach();
  completed_.erase(mb);
  return DeferredLinearFunction::apply(x2d, weight, this, mb).reshape(out_shape);
}

void DeferredLinear::input_gradient_done(int64_t mb, const torch::Tensor& dy) {
  grads_[mb] = dy;
  auto x = inputs_.find(mb);
  if (x == inputs_.end() || dy.dim() != 2) return;
  const bool fp32 = native_eligible(dy) && native_eligible(x->second) && native_eligible(layer_->weight);
  const bool bf16 = native_bf16_eligible(dy) && native_bf16_eligible(x->second);
  if (!fp32 && !bf16) return;
  if (std::find(order_.begin(), order_.end(), mb) != order_.end()) return;
  order_.push_back(mb);
  const auto blocks = static_cast<size_t>((layer_->weight.size(0) + kBlockRows - 1) / kBlockRows);
  if (done_.size() != blocks) {
    done_.assign(blocks, 0);
    started_.assign(blocks, false);
    block_sq_.assign(blocks, 0.0);
    block_sq_known_.assign(blocks, false);
  }
}

void DeferredLinear::backward_weight(const std::vector<int64_t>& mbs) {
  if (mbs.empty()) return;
  const size_t upto = order_end_of(mbs);
  std::vector<int64_t> grouped;
  for (int64_t mb : mbs) {
    if (std::find(order_.begin(), order_.end(), mb) == order_.end() && !completed_.count(mb)) grouped.push_back(mb);
  }
  for (size_t b = 0; b < done_.size(); ++b) {
    if (done_[b] < upto) accumulate_block(b, upto);
  }
  drop_completed();
  group_product(grouped);
}

bool DeferredLinear::has_queued_weight_work() const {
  return std::any_of(done_.begin(), done_.end(), [this](size_t d) { return d < order_.size(); });
}

bool DeferredLinear::accumulate_some(size_t max_micro_batches) {
  if (!has_queued_weight_work()) return false;
  const auto behind = std::min_element(done_.begin(), done_.end());
  const size_t upto = max_micro_batches == 0 ? order_.size() : std::min(order_.size(), *behind + max_micro_batches);
  accumulate_block(static_cast<size_t>(behind - done_.begin()), upto);
  drop_completed();
  return true;
}

size_t DeferredLinear::order_end_of(const std::vector<int64_t>& mbs) const {
  size_t upto = 0;
  for (int64_t mb : mbs) {
    const auto at = std::find(order_.begin(), order_.end(), mb);
    if (at != order_.end()) upto = std::max(upto, static_cast<size_t>(at - order_.begin()) + 1);
  }
  return upto;
}

bool DeferredLinear::has_queued_weight_work_of(const std::vector<int64_t>& mbs) const {
  const size_t upto = order_end_of(mbs);
  return std::any_of(done_.begin(), done_.end(), [upto](size_t d) { return d < upto; });
}

bool DeferredLinear::accumulate_some_of(const std::vector<int64_t>& mbs) {
  const size_t upto = order_end_of(mbs);
  const auto behind = std::min_element(done_.begin(), done_.end());
  if (behind == done_.end() || *behind >= upto) return false;
  accumulate_block(static_cast<size_t>(behind - done_.begin()), upto);
  drop_completed();
  return true;
}

void DeferredLinear::accumulate_all() {
  backward_weight(std::vector<int64_t>(order_));
  std::vector<int64_t> rest;
  for (const auto& [mb, _] : grads_) rest.push_back(mb);
  group_product(rest);
}

void DeferredLinear::adopt_gradients() {
  auto& weight = layer_->weight;
  auto& bias = layer_->bias;
  if (weight.grad().defined() && weight.grad().unsafeGetTensorImpl() == dw_.unsafeGetTensorImpl()) return;
  // A new sum (the engine set .grad to none) or one started elsewhere (kept, added to). The
  // buffers are reused unless someone still holds last step's gradient.
  auto reusable = [](const torch::Tensor& t, const torch::Tensor& like) {
    return t.defined() && t.sizes() == like.sizes() && t.use_count() == 1 && t.storage().use_count() == 1;
  };
  torch::NoGradGuard no_grad;
  if (!reusable(dw_, weight)) dw_ = torch::empty_like(weight, torch::MemoryFormat::Contiguous);
  if (bias.defined() && !reusable(db_, bias)) db_ = torch::empty_like(bias, torch::MemoryFormat::Contiguous);
  const bool had = weight.grad().defined() || (bias.defined() && bias.grad().defined());
  if (had) {
    // Continued from, block by block, like this step's own sum.
    if (weight.grad().defined()) {
      dw_.copy_(weight.grad());
    } else {
      dw_.zero_();
    }
    if (bias.defined()) {
      if (bias.grad().defined()) {
        db_.copy_(bias.grad());
      } else {
        db_.zero_();
      }
    }
  }
  std::fill(started_.begin(), started_.end(), had);
  std::fill(block_sq_known_.begin(), block_sq_known_.end(), false);
  weight.mutable_grad() = dw_;
  if (bias.defined()) bias.mutable_grad() = db_;
  sq_version_ = static_cast<int64_t>(dw_._version());
}

template <typename Operands>
std::vector<const Operands*> DeferredLinear::parts(std::map<int64_t, std::unique_ptr<Operands>>& operands, size_t from,
                                                   size_t upto) {
  std::vector<const Operands*> out;
  for (size_t i = from; i < upto; ++i) {
    const int64_t mb = order_[i];
    auto& op = operands[mb];
    if (!op) op = std::make_unique<Operands>(grads_.at(mb), inputs_.at(mb));
    out.push_back(op.get());
  }
  return out;
}

void DeferredLinear::accumulate_block(size_t block, size_t upto) {
  if (done_[block] >= upto) return;
  adopt_gradients();
  const int64_t out = layer_->weight.size(0);
  const int64_t begin = static_cast<int64_t>(block) * kBlockRows;
  const int64_t end = std::min(out, begin + kBlockRows);
  float* db = layer_->bias.defined() ? db_.data_ptr<float>() : nullptr;
  // One precision per step (the engine's); the first queued micro-batch tells which.
  if (grads_.at(order_[done_[block]]).scalar_type() == torch::kBFloat16) {
    native_weight_grad_bf16(dw_.data_ptr<float>(), db, begin, end, parts(operands_bf16_, done_[block], upto),
                            !started_[block], &block_sq_[block]);
  } else {
    native_weight_grad(dw_.data_ptr<float>(), db, begin, end, parts(operands_, done_[block], upto), !started_[block],
                       &block_sq_[block]);
  }
  block_sq_known_[block] = true;
  started_[block] = true;
  done_[block] = upto;
}

void DeferredLinear::drop_completed() {
  if (done_.empty()) return;
  const size_t n = *std::min_element(done_.begin(), done_.end());
  if (n == 0) return;
  for (size_t i = 0; i < n; ++i) {
    forget(order_[i]);
    completed_.insert(order_[i]);
  }
  order_.erase(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n));
  for (auto& d : done_) d -= n;
}

void DeferredLinear::group_product(const std::vector<int64_t>& mbs) {
  if (mbs.empty() || frozen()) return;  // autograd gave the trainable parameters theirs
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
  // Low precision: one product over the group's rows (float32 sums inside the GEMM, one
  // rounding), then float32 into .grad.
  torch::Tensor dw = gemm(dy.t(), x, kernel_).to(weight.scalar_type());
  if (weight.grad().defined()) {
    weight.mutable_grad().add_(dw);
  } else {
    weight.mutable_grad() = dw;
  }
  auto& bias = layer_->bias;
  if (bias.defined()) {
    auto db = dy.sum(0, /*keepdim=*/false, bias.scalar_type());
    if (bias.grad().defined()) {
      bias.mutable_grad().add_(db);
    } else {
      bias.mutable_grad() = db;
    }
  }
  for (int64_t mb : mbs) forget(mb);
}

std::optional<double> DeferredLinear::weight_grad_sqnorm() const {
  const auto& grad = layer_->weight.grad();
  // Only the accumulator's own values, unchanged since its kernel wrote them: the kernel's
  // writes leave the version alone, any in-place op on the gradient moves it.
  if (!grad.defined() || !dw_.defined() || grad.unsafeGetTensorImpl() != dw_.unsafeGetTensorImpl()) return {};
  if (static_cast<int64_t>(dw_._version()) != sq_version_) return {};
  if (block_sq_known_.empty() ||
      std::any_of(block_sq_known_.begin(), block_sq_known_.end(), [](bool known) { return !known; })) {
    return {};
  }
  double sum = 0.0;
  for (const double v : block_sq_) sum += v;
  return sum;
}

std::vector<int64_t> DeferredLinear::pending() const {
  std::vector<int64_t> mbs;
  for (const auto& [mb, _] : grads_) mbs.push_back(mb);
  return mbs;
}

void DeferredLinear::forget(int64_t mb) {
  inputs_.erase(mb);
  grads_.erase(mb);
  operands_.erase(mb);
  operands_bf16_.erase(mb);
}

void DeferredLinear::discard(const std::vector<int64_t>& mbs) {
  for (int64_t mb : mbs) {
    if (std::find(order_.begin(), order_.end(), mb) == order_.end() && !grads_.count(mb)) forget(mb);
  }
}

void DeferredLinear::clear() {
  inputs_.clear();
  grads_.clear();
  operands_.clear();
  operands_bf16_.clear();
  order_.clear();
  completed_.clear();
  std::fill(done_.begin(), done_.end(), 0);
}

}  // namespace pipetrain::runtime
