// Dropout drawing from the current task generator.
#include "pipetrain/runtime/dropout.h"

#include "pipetrain/error.h"
#include "pipetrain/runtime/rng.h"

namespace pipetrain::runtime {

DropoutImpl::DropoutImpl(const torch::nn::DropoutOptions& options_) : options(options_) {
  reset();
}

void DropoutImpl::reset() {
  if (options.p() < 0.0 || options.p() > 1.0) {
    throw ConfigError("dropout probability must be in [0, 1], got " +
                      std::to_string(options.p()));
  }
}

torch::Tensor DropoutImpl::forward(torch::Tensor input) {
  const double p = options.p();
  if (!is_training() || p == 0.0) return input;
  if (p == 1.0) return options.inplace() ? input.zero_() : input * 0;
  // A CPU generator cannot fill a CUDA tensor: the mask comes from a generator of the input's device.
  torch::Tensor mask = torch::empty_like(input).bernoulli_(1.0 - p, current_generator(input.device()));
  mask.div_(1.0 - p);
  return options.inplace() ? input.mul_(mask) : input * mask;
}

void DropoutImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::runtime::Dropout(p=" << options.p()
         << ", inplace=" << (options.inplace() ? "true" : "false") << ")";
}

}  // namespace pipetrain::runtime

namespace pipetrain::runtime {

torch::nn::Sequential convert_dropout(const torch::nn::Sequential& model) {
  torch::nn::Sequential out;
  const auto& names = model->named_children();
  size_t k = 0;
  for (const auto& layer : *model) {
    const std::string name = names[k++].key();
    const std::shared_ptr<torch::nn::Module> ptr = layer.ptr();
    if (auto dropout = std::dynamic_pointer_cast<torch::nn::DropoutImpl>(ptr)) {
      Dropout converted(dropout->options);
      if (!dropout->is_training()) converted->eval();
      out->push_back(name, torch::nn::AnyModule(converted));
    } else {
      out->push_back(name, layer);
    }
  }
  if (!model->is_training()) out->eval();
  return out;
}

}  // namespace pipetrain::runtime
