// Deferred batch norm: running statistics once per mini-batch.
#include "pipetrain/runtime/deferred_batch_norm.h"

#include "pipetrain/error.h"
#include "pipetrain/runtime/checkpoint.h"

namespace pipetrain::runtime {

DeferredBatchNormImpl::DeferredBatchNormImpl(const torch::nn::BatchNormOptions& options_)
    : options(options_) {
  reset();
}

DeferredBatchNormImpl::DeferredBatchNormImpl(const torch::nn::BatchNormOptions& options_,
                                             torch::Tensor weight_, torch::Tensor bias_,
                                             torch::Tensor running_mean_,
                                             torch::Tensor running_var_,
                                             torch::Tensor num_batches_tracked_)
    : options(options_),
      weight(std::move(weight_)),
      bias(std::move(bias_)),
      running_mean(std::move(running_mean_)),
      running_var(std::move(running_var_)),
      num_batches_tracked(std::move(num_batches_tracked_)) {
  register_tensors();
}

void DeferredBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  weight = options.affine() ? torch::ones({c}) : torch::Tensor();
  bias = options.affine() ? torch::zeros({c}) : torch::Tensor();
  running_mean = torch::zeros({c});
  running_var = torch::ones({c});
  num_batches_tracked = torch::tensor(0, torch::kLong);
  register_tensors();
}

void DeferredBatchNormImpl::register_tensors() {
  weight = register_parameter("weight", weight, /*requires_grad=*/options.affine());
  bias = register_parameter("bias", bias, /*requires_grad=*/options.affine());
  running_mean = register_buffer("running_mean", running_mean);
  running_var = register_buffer("running_var", running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", num_batches_tracked);
  discard();
}

torch::Tensor DeferredBatchNormImpl::forward(const torch::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features()) {
    throw BatchError("DeferredBatchNorm expects input of shape (N, " +
                     std::to_string(options.num_features()) + ", ...), got " +
                     c10::str(input.sizes()));
  }
  if (!is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, false, 0.0,
                             options.eps(), at::globalContext().userEnabledCuDNN());
  }
  if (!is_recomputing()) {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
    const torch::Tensor x = input.detach().to(torch::kDouble);
    if (!sum_.defined()) {
      sum_ = torch::zeros({options.num_features()}, x.options());
      sum_squares_ = torch::zeros_like(sum_);
    }
    sum_ += x.sum(dims);
    sum_squares_ += x.square().sum(dims);
    count_ += input.numel() / input.size(1);
    ++tracked_;
  }
  return torch::batch_norm(input, weight, bias, torch::Tensor(), torch::Tensor(), true, 0.0,
                           options.eps(), at::globalContext().userEnabledCuDNN());
}

void DeferredBatchNormImpl::commit() {
  if (tracked_ == 0) return;
  torch::NoGradGuard no_grad;
  num_batches_tracked += 1;
  const double m = options.momentum().has_value()
                       ? *options.momentum()
                       : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  const auto n = static_cast<double>(count_);
  const torch::Tensor mean = sum_ / n;
  torch::Tensor var = sum_squares_ / n - mean.square();
  if (count_ > 1) var = var * (n / (n - 1.0));
  running_mean.mul_(1.0 - m).add_(mean.to(running_mean.dtype()), m);
  running_var.mul_(1.0 - m).add_(var.to(running_var.dtype()), m);
  discard();
}

void DeferredBatchNormImpl::discard() {
  sum_ = torch::Tensor();
  sum_squares_ = torch::Tensor();
  count_ = 0;
  tracked_ = 0;
}

void DeferredBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::runtime::DeferredBatchNorm(" << options.num_features()
         << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ")";
}

namespace {

// The deferred twin of a BatchNorm module, sharing its tensors; nullptr if it is none.
template <typename BN>
std::shared_ptr<DeferredBatchNormImpl> deferred_from(const std::shared_ptr<torch::nn::Module>& m) {
  auto bn = std::dynamic_pointer_cast<BN>(m);
  if (!bn || !bn->options.track_running_stats()) return nullptr;
  auto options = torch::nn::BatchNormOptions(bn->options.num_features())
                     .eps(bn->options.eps())
                     .momentum(bn->options.momentum())
                     .affine(bn->options.affine())
                     .track_running_stats(true);
  // Share the very tensors (an optimizer built on the original model keeps working).
  auto d = std::make_shared<DeferredBatchNormImpl>(options, bn->weight, bn->bias,
                                                   bn->running_mean, bn->running_var,
                                                   bn->num_batches_tracked);
  if (!bn->is_training()) d->eval();
  return d;
}

}  // namespace

torch::nn::Sequential convert_deferred_batch_norm(const torch::nn::Sequential& model) {
  torch::nn::Sequential out;
  const auto& names = model->named_children();
  size_t k = 0;
  for (const auto& layer : *model) {
    const std::string name = names[k++].key();
    const std::shared_ptr<torch::nn::Module> ptr = layer.ptr();
    std::shared_ptr<DeferredBatchNormImpl> d;
    if (!(d = deferred_from<torch::nn::BatchNorm1dImpl>(ptr)) &&
        !(d = deferred_from<torch::nn::BatchNorm2dImpl>(ptr))) {
      d = deferred_from<torch::nn::BatchNorm3dImpl>(ptr);
    }
    if (d) {
      out->push_back(name, torch::nn::AnyModule(DeferredBatchNorm(d)));
    } else {
      out->push_back(name, layer);
    }
  }
  if (!model->is_training()) out->eval();
  return out;
}

std::vector<std::shared_ptr<DeferredBatchNormImpl>> deferred_batch_norms(torch::nn::Module& module) {
  std::vector<std::shared_ptr<DeferredBatchNormImpl>> found;
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (auto d = std::dynamic_pointer_cast<DeferredBatchNormImpl>(m)) found.push_back(d);
  }
  return found;
}

}  // namespace pipetrain::runtime
