// Optimizers from the config's "optimizer" section, and setting their learning rate.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "pipetrain/engine/config.h"

namespace pipetrain {

// SGD (momentum, nesterov, weight decay), Adam, AdamW, RMSprop or Adagrad over `params`, with
// the config's hyper-parameters. ConfigError for an unknown type.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<torch::Tensor> params);

// Sets the learning rate of every parameter group (the LR scheduler's hook).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);
double learning_rate(const torch::optim::Optimizer& optimizer);

}  // namespace pipetrain
