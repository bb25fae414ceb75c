// The optimizer an EngineConfig's "optimizer" section describes, over a list of parameters.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "pipetrain/engine/config.h"

namespace pipetrain {

// SGD (momentum, dampening 0, weight decay, nesterov), Adam, AdamW (decoupled weight decay),
// RMSprop (alpha, eps, momentum, weight decay) and Adagrad (eps, weight decay), with the
// config's learning rate. ConfigError for an unknown type or values the optimizer rejects
// (nesterov without momentum, a negative rate).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<torch::Tensor> params);

// Sets the learning rate of every parameter group (for SchedulerConfig::lr_at each step).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// The learning rate of the first parameter group.
double learning_rate(const torch::optim::Optimizer& optimizer);

}  // namespace pipetrain
