// The optimizer an EngineConfig's "optimizer" section describes, over a list of parameters.
#include "pipetrain/engine/optimizer.h"

#include <fmt/format.h>

#include <cmath>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw ConfigError("optimizer: " + what);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        std::vector<torch::Tensor> params) {
  check(std::isfinite(c.lr) && c.lr >= 0, fmt::format("lr must be a number >= 0, got {}", c.lr));
  check(c.weight_decay >= 0, fmt::format("weight_decay must be >= 0, got {}", c.weight_decay));
  check(c.momentum >= 0, fmt::format("momentum must be >= 0, got {}", c.momentum));
  check(c.eps >= 0, fmt::format("eps must be >= 0, got {}", c.eps));
  if (c.type == "SGD") {
    check(!c.nesterov || c.momentum > 0,
          "nesterov needs momentum > 0; set \"momentum\" (e.g. 0.9) or drop \"nesterov\"");
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(c.lr)
                                                                      .momentum(c.momentum)
                                                                      .weight_decay(c.weight_decay)
                                                                      .nesterov(c.nesterov));
  }
  if (c.type == "Adam" || c.type == "AdamW") {
    for (const double b : c.betas)
      check(b >= 0 && b < 1, fmt::format("betas must lie in [0, 1), got {}", b));
    const std::tuple<double, double> betas{c.betas[0], c.betas[1]};
    if (c.type == "Adam")
      return std::make_unique<torch::optim::Adam>(
          std::move(params),
          torch::optim::AdamOptions(c.lr).betas(betas).eps(c.eps).weight_decay(c.weight_decay));
    return std::make_unique<torch::optim::AdamW>(
        std::move(params),
        torch::optim::AdamWOptions(c.lr).betas(betas).eps(c.eps).weight_decay(c.weight_decay));
  }
  if (c.type == "RMSprop")
    return std::make_unique<torch::optim::RMSprop>(std::move(params),
                                                   torch::optim::RMSpropOptions(c.lr)
                                                       .alpha(c.alpha)
                                                       .eps(c.eps)
                                                       .momentum(c.momentum)
                                                       .weight_decay(c.weight_decay));
  if (c.type == "Adagrad")
    return std::make_unique<torch::optim::Adagrad>(
        std::move(params),
        torch::optim::AdagradOptions(c.lr).eps(c.eps).weight_decay(c.weight_decay));
  throw ConfigError(fmt::format(
      "optimizer: type \"{}\" is not supported; expected SGD, Adam, AdamW, RMSprop or Adagrad",
      c.type));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double learning_rate(const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  if (groups.empty()) throw UsageError("the optimizer has no parameter groups");
  return groups.front().options().get_lr();
}

}  // namespace pipetrain
