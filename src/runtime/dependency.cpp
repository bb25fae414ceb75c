// Fork/join: an explicit backward-order dependency between two micro-batches.
#include "pipetrain/runtime/dependency.h"

namespace pipetrain::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ForkFunction : torch::autograd::Function<ForkFunction> {
  static variable_list forward(AutogradContext*, const torch::Tensor& input) {
    return {input.detach(), torch::empty({0}, input.options())};
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0]}; }
};

struct JoinFunction : torch::autograd::Function<JoinFunction> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input,
                               const torch::Tensor& /*phony*/) {
    return input.detach();
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

// Index of the first floating tensor of a batch, or -1.
int64_t first_floating(const Batch& batch) {
  for (size_t k = 0; k < batch.size(); ++k) {
    if (batch[k].is_floating_point()) return static_cast<int64_t>(k);
  }
  return -1;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> fork(const torch::Tensor& input) {
  if (torch::GradMode::is_enabled() && input.requires_grad()) {
    auto out = ForkFunction::apply(input);
    return {out[0], out[1]};
  }
  return {input, torch::empty({0}, input.options())};
}

torch::Tensor join(const torch::Tensor& input, const torch::Tensor& phony) {
  if (torch::GradMode::is_enabled() && (input.requires_grad() || phony.requires_grad())) {
    return JoinFunction::apply(input, phony);
  }
  return input;
}

void depend(Batch& fork_from, Batch& join_to) {
  const int64_t a = first_floating(fork_from);
  const int64_t b = first_floating(join_to);
  if (a < 0 || b < 0 || !torch::GradMode::is_enabled() || !fork_from[a].requires_grad()) return;
  auto [forked, phony] = fork(fork_from[a]);
  fork_from[a] = forked;
  join_to[b] = join(join_to[b], phony);
}

}  // namespace pipetrain::runtime
