// The optimizer factory.
#include "pipetrain/engine/optimizer.h"

#include "pipetrain/error.h"

namespace pipetrain {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        std::vector<torch::Tensor> params) {
  namespace optim = torch::optim;
  if (c.type == "SGD") {
    return std::make_unique<optim::SGD>(
        params, optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
  }
  if (c.type == "Adam") {
    return std::make_unique<optim::Adam>(params, optim::AdamOptions(c.lr)
                                                     .betas({c.betas[0], c.betas[1]})
                                                     .eps(c.eps)
                                                     .weight_decay(c.weight_decay));
  }
  if (c.type == "AdamW") {
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(c.lr)
                                                      .betas({c.betas[0], c.betas[1]})
                                                      .eps(c.eps)
                                                      .weight_decay(c.weight_decay));
  }
  if (c.type == "RMSprop") {
    return std::make_unique<optim::RMSprop>(params, optim::RMSpropOptions(c.lr)
                                                        .alpha(c.alpha)
                                                        .eps(c.eps)
                                                        .momentum(c.momentum)
                                                        .weight_decay(c.weight_decay));
  }
  if (c.type == "Adagrad") {
    return std::make_unique<optim::Adagrad>(
        params, optim::AdagradOptions(c.lr).eps(c.eps).weight_decay(c.weight_decay));
  }
  throw ConfigError("optimizer type \"" + c.type + "\" is unknown; use SGD, Adam, AdamW, RMSprop or Adagrad");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double learning_rate(const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  return groups.empty() ? 0.0 : groups.front().options().get_lr();
}

}  // namespace pipetrain
