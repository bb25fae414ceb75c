// Activation checkpointing: gradients equal the plain run, masks repeat, flags tell phases apart.
#include "pipetrain/runtime/checkpoint.h"

#include <gtest/gtest.h>

#include "pipetrain/runtime/dropout.h"
#include "pipetrain/runtime/rng.h"

namespace pipetrain::runtime {
namespace {

torch::nn::Sequential small_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

std::vector<torch::Tensor> grads_of(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().clone());
  return out;
}

void zero_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
}

TEST(Checkpoint, GradientsEqualThePlainRun) {
  auto model = small_model();
  torch::Tensor x = torch::randn({5, 8}, torch::requires_grad());
  model->forward(x).pow(2).sum().backward();
  const auto plain = grads_of(*model);
  const torch::Tensor plain_dx = x.grad().clone();

  zero_grads(*model);
  x.mutable_grad() = torch::Tensor();
  auto out = checkpointed_forward([&](const Tensors& in) { return Tensors{model->forward(in[0])}; },
                                  {x});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].requires_grad());
  out[0].pow(2).sum().backward();
  const auto ckpt = grads_of(*model);
  // The recomputation repeats the same operations in the same order: bitwise equal.
  for (size_t k = 0; k < plain.size(); ++k) EXPECT_TRUE(torch::equal(plain[k], ckpt[k])) << k;
  EXPECT_TRUE(torch::equal(plain_dx, x.grad()));
}

TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  auto model = small_model();
  const torch::Tensor x = torch::randn({5, 8});
  model->forward(x).sum().backward();
  const auto plain = grads_of(*model);
  zero_grads(*model);
  auto out = checkpointed_forward([&](const Tensors& in) { return Tensors{model->forward(in[0])}; },
                                  {x});
  out[0].sum().backward();
  const auto ckpt = grads_of(*model);
  for (size_t k = 0; k < plain.size(); ++k) EXPECT_TRUE(torch::equal(plain[k], ckpt[k])) << k;
}

TEST(Checkpoint, KeepsNothingButTheInputsAtForward) {
  // fn's intermediate results are freed after forward: a tensor made inside fn is gone.
  auto model = small_model();
  torch::Tensor x = torch::randn({5, 8}, torch::requires_grad());
  std::weak_ptr<int> probe;  // stands for "something fn made"
  torch::Tensor hidden_seen;
  auto out = checkpointed_forward(
      [&](const Tensors& in) {
        torch::Tensor h = torch::tanh(in[0]);
        if (is_checkpointing()) hidden_seen = h;
        return Tensors{h.sum(1)};
      },
      {x});
  EXPECT_FALSE(hidden_seen.requires_grad());  // built under no_grad: no graph kept
  EXPECT_TRUE(out[0].requires_grad());
}

TEST(Checkpoint, FlagsTellThePhasesApart) {
  std::vector<std::pair<bool, bool>> seen;
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  EXPECT_FALSE(is_checkpointing());
  EXPECT_FALSE(is_recomputing());
  auto out = checkpointed_forward(
      [&](const Tensors& in) {
        seen.emplace_back(is_checkpointing(), is_recomputing());
        return Tensors{in[0] * 2};
      },
      {x});
  EXPECT_FALSE(is_checkpointing());
  out[0].sum().backward();
  EXPECT_FALSE(is_recomputing());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(true, false));
  EXPECT_EQ(seen[1], std::make_pair(false, true));
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, 2.0)));
}

TEST(Checkpoint, GradModeOffRunsThePlainFunction) {
  torch::NoGradGuard no_grad;
  bool flagged = true;
  auto out = checkpointed_forward(
      [&](const Tensors& in) {
        flagged = is_checkpointing();
        return Tensors{in[0] + 1};
      },
      {torch::zeros({2})});
  EXPECT_FALSE(flagged);
  EXPECT_TRUE(torch::equal(out[0], torch::ones({2})));
}

// The dropout mask of the recomputation equals the forward's: where the output is zero, the
// input gradient is zero, and nowhere else.
void expect_same_mask_on_recompute(bool task_generator) {
  runtime::Dropout dropout(0.5);
  torch::Tensor x = torch::ones({64, 64}, torch::requires_grad());
  std::optional<TaskGeneratorScope> scope;
  if (task_generator) scope.emplace(make_generator(11));
  torch::manual_seed(1);
  auto out = checkpointed_forward([&](const Tensors& in) { return Tensors{dropout(in[0])}; }, {x});
  scope.reset();
  torch::randn({1000});  // move the default generator on between forward and backward
  out[0].backward(torch::ones_like(out[0]));
  const torch::Tensor out_zero = out[0].detach() == 0;
  const torch::Tensor grad_zero = x.grad() == 0;
  EXPECT_GT(out_zero.sum().item<int64_t>(), 1000);
  EXPECT_TRUE(torch::equal(out_zero, grad_zero));
  EXPECT_TRUE(torch::equal(out[0].detach(), x.grad()));  // both are mask / (1 - p)
}

TEST(Checkpoint, DropoutMaskIdenticalOnRecomputeWithDefaultGenerator) {
  expect_same_mask_on_recompute(false);
}

TEST(Checkpoint, DropoutMaskIdenticalOnRecomputeWithTaskGenerator) {
  expect_same_mask_on_recompute(true);
}

TEST(Checkpoint, TorchDropoutMaskIdenticalOnRecomputeSingleThreaded) {
  torch::nn::Dropout dropout(0.3);
  torch::Tensor x = torch::ones({32, 32}, torch::requires_grad());
  auto out = checkpointed_forward([&](const Tensors& in) { return Tensors{dropout(in[0])}; }, {x});
  torch::rand({77});
  out[0].backward(torch::ones_like(out[0]));
  EXPECT_TRUE(torch::equal(out[0].detach() == 0, x.grad() == 0));
}

TEST(Checkpoint, NonFloatingInputsAndOutputsGetNoGradient) {
  torch::Tensor x = torch::randn({4, 3}, torch::requires_grad());
  const torch::Tensor mask = torch::tensor({1, 0, 1, 1}, torch::kLong);
  auto out = checkpointed_forward(
      [](const Tensors& in) {
        return Tensors{in[0] * in[1].unsqueeze(1).to(torch::kFloat), in[1] + 1};
      },
      {x, mask});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_TRUE(torch::equal(out[1], mask + 1));
  out[0].sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), mask.unsqueeze(1).to(torch::kFloat).expand({4, 3})));
}

TEST(Checkpoint, NestedCheckpointsGiveThePlainGradients) {
  auto model = small_model();
  torch::Tensor x = torch::randn({5, 8}, torch::requires_grad());
  model->forward(x).pow(2).sum().backward();
  const auto plain = grads_of(*model);
  zero_grads(*model);
  std::vector<int> calls(2, 0);
  auto out = checkpointed_forward(
      [&](const Tensors& in) {
        ++calls[0];
        auto inner = checkpointed_forward(
            [&](const Tensors& a) {
              ++calls[1];
              return Tensors{(*model)[1]->as<torch::nn::Tanh>()->forward(
                  (*model)[0]->as<torch::nn::Linear>()->forward(a[0]))};
            },
            in);
        return Tensors{(*model)[2]->as<torch::nn::Linear>()->forward(inner[0])};
      },
      {x});
  out[0].pow(2).sum().backward();
  const auto ckpt = grads_of(*model);
  for (size_t k = 0; k < plain.size(); ++k) EXPECT_TRUE(torch::allclose(plain[k], ckpt[k])) << k;
  EXPECT_EQ(calls[0], 2);  // forward + recompute of the outer
  EXPECT_GE(calls[1], 2);
}

TEST(Checkpoint, ExceptionInRecomputationReachesBackward) {
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  auto out = checkpointed_forward(
      [](const Tensors& in) {
        if (is_recomputing()) throw std::runtime_error("boom in recompute");
        return Tensors{in[0] * 3};
      },
      {x});
  try {
    out[0].sum().backward();
    FAIL() << "expected an exception";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("boom in recompute"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::runtime
