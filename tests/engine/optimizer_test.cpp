// make_optimizer: each type from its config matches LibTorch's optimizer built by hand.
#include "pipetrain/engine/optimizer.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

// Two steps of `optimizer` on a fixed quadratic; returns the parameter afterwards.
torch::Tensor two_steps(
    const std::function<std::unique_ptr<torch::optim::Optimizer>(torch::Tensor)>& make) {
  auto p = torch::tensor({1.0, -2.0, 3.0}).requires_grad_(true);
  auto opt = make(p);
  for (int i = 0; i < 2; ++i) {
    opt->zero_grad();
    (p * p * torch::tensor({1.0, 2.0, 3.0})).sum().backward();
    opt->step();
  }
  return p.detach();
}

TEST(Optimizer, MatchesLibTorchForEachType) {
  OptimizerConfig sgd;
  sgd.type = "SGD";
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;
  EXPECT_TRUE(torch::allclose(
      two_steps([&](torch::Tensor p) { return make_optimizer(sgd, {p}); }),
      two_steps([](torch::Tensor p) {
        return std::make_unique<torch::optim::SGD>(
            std::vector<torch::Tensor>{p},
            torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
      })));

  OptimizerConfig adamw;
  adamw.type = "AdamW";
  adamw.lr = 0.05;
  adamw.betas = {0.8, 0.9};
  adamw.weight_decay = 0.1;
  EXPECT_TRUE(
      torch::allclose(two_steps([&](torch::Tensor p) { return make_optimizer(adamw, {p}); }),
                      two_steps([](torch::Tensor p) {
                        return std::make_unique<torch::optim::AdamW>(
                            std::vector<torch::Tensor>{p},
                            torch::optim::AdamWOptions(0.05).betas({0.8, 0.9}).weight_decay(0.1));
                      })));

  OptimizerConfig adam = adamw;
  adam.type = "Adam";
  const auto adam_result = two_steps([&](torch::Tensor p) { return make_optimizer(adam, {p}); });
  EXPECT_FALSE(torch::allclose(
      adam_result, two_steps([&](torch::Tensor p) { return make_optimizer(adamw, {p}); })));
  for (const char* type : {"RMSprop", "Adagrad"}) {
    OptimizerConfig c;
    c.type = type;
    auto p = torch::ones({2}).requires_grad_(true);
    EXPECT_NE(make_optimizer(c, {p}), nullptr) << type;
  }
}

TEST(Optimizer, LearningRateCanBeSetPerStep) {
  OptimizerConfig c;
  c.type = "Adam";
  c.lr = 0.1;
  auto p = torch::ones({2}).requires_grad_(true);
  auto opt = make_optimizer(c, {p});
  EXPECT_DOUBLE_EQ(learning_rate(*opt), 0.1);
  set_learning_rate(*opt, 0.02);
  EXPECT_DOUBLE_EQ(learning_rate(*opt), 0.02);
}

TEST(Optimizer, RejectsUnknownTypesAndBadValues) {
  auto p = torch::ones({2}).requires_grad_(true);
  OptimizerConfig c;
  c.type = "Lamb";
  EXPECT_THROW(make_optimizer(c, {p}), ConfigError);
  c.type = "SGD";
  c.nesterov = true;
  EXPECT_THROW(make_optimizer(c, {p}), ConfigError);
  c.nesterov = false;
  c.lr = -1;
  EXPECT_THROW(make_optimizer(c, {p}), ConfigError);
}

}  // namespace
}  // namespace pipetrain
