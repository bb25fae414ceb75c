// The oracle: GPipe gives the loss and gradients of the same model run without a pipeline.
#include <gtest/gtest.h>

#include <tuple>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"

namespace pipetrain {
namespace {

using testing::deep_copy;
using testing::expect_close;
using testing::grads;

struct TransparencyCase {
  int64_t chunks;
  std::vector<int64_t> balance;
  Checkpoint checkpoint;
};

std::string transparency_case_name(const TransparencyCase& c) {
  std::string out = "chunks" + std::to_string(c.chunks) + "_balance";
  for (auto b : c.balance) out += std::to_string(b);
  return out + "_" + to_string(c.checkpoint);
}

class Transparency : public ::testing::TestWithParam<TransparencyCase> {};

TEST_P(Transparency, LossAndGradientsEqualThePlainModel) {
  const TransparencyCase& c = GetParam();
  torch::manual_seed(0);
  auto model = testing::mlp6();
  auto plain = deep_copy(model);
  const torch::Tensor x = torch::randn({14, 8});
  const torch::Tensor y = torch::randn({14, 4});

  const torch::Tensor plain_loss = torch::mse_loss(plain->forward(x), y);
  plain_loss.backward();

  GPipe gpipe(model, GPipeOptions(c.balance).chunks(c.chunks).checkpoint(c.checkpoint));
  const torch::Tensor loss = torch::mse_loss(gpipe->forward(x), y);
  loss.backward();

  EXPECT_TRUE(torch::allclose(loss, plain_loss, 1e-6, 1e-7))
      << loss.item<double>() << " vs " << plain_loss.item<double>();
  expect_close(grads(*gpipe), grads(*plain), transparency_case_name(c));
}

std::vector<TransparencyCase> transparency_cases() {
  std::vector<TransparencyCase> out;
  for (int64_t chunks : {1, 2, 4, 7}) {
    for (std::vector<int64_t> balance :
         {std::vector<int64_t>{3, 3}, {1, 5}, {2, 1, 3}, {1, 1, 1, 1, 1, 1}}) {
      for (Checkpoint mode : {Checkpoint::Always, Checkpoint::ExceptLast, Checkpoint::Never}) {
        out.push_back({chunks, balance, mode});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(GPipe, Transparency, ::testing::ValuesIn(transparency_cases()),
                         [](const auto& info) { return transparency_case_name(info.param); });

TEST(GPipeTransparency, InputGradientEqualsThePlainModel) {
  torch::manual_seed(1);
  auto model = testing::mlp6();
  auto plain = deep_copy(model);
  torch::Tensor x1 = torch::randn({9, 8}, torch::requires_grad());
  torch::Tensor x2 = x1.detach().clone().requires_grad_(true);
  plain->forward(x1).pow(2).sum().backward();
  GPipe gpipe(model, GPipeOptions({2, 4}).chunks(4));
  gpipe->forward(x2).pow(2).sum().backward();
  expect_close({x2.grad()}, {x1.grad()}, "input gradient");
}

// A layer over a tuple (activation, mask): scales by the float mask, passes the mask on.
struct MaskedLinearImpl : torch::nn::Cloneable<MaskedLinearImpl> {
  MaskedLinearImpl(int64_t in, int64_t out) : in_(in), out_(out) { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(in_, out_)); }
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> input) {
    const torch::Tensor& mask = input.at(1);
    EXPECT_FALSE(mask.is_floating_point());
    EXPECT_FALSE(mask.requires_grad());
    return {torch::tanh(linear(input.at(0))) * mask.unsqueeze(1).to(torch::kFloat), mask};
  }
  int64_t in_, out_;
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(MaskedLinear);

TEST(GPipeTransparency, TupleInputWithANonFloatTensor) {
  torch::manual_seed(2);
  torch::nn::Sequential model(MaskedLinear(8, 8), MaskedLinear(8, 8), MaskedLinear(8, 3));
  auto plain = deep_copy(model);
  const torch::Tensor x = torch::randn({10, 8});
  const torch::Tensor mask = torch::randint(0, 2, {10}, torch::kLong);

  auto plain_out = plain->forward<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{x, mask});
  plain_out[0].sum().backward();

  GPipe gpipe(model, GPipeOptions({1, 2}).chunks(3).checkpoint(Checkpoint::Always));
  auto out = gpipe->forward(std::vector<torch::Tensor>{x, mask});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(torch::equal(out[1], mask));
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_TRUE(torch::allclose(out[0], plain_out[0], 1e-6, 1e-7));
  out[0].sum().backward();
  expect_close(grads(*gpipe), grads(*plain), "tuple model");
}

TEST(GPipeTransparency, EmptySequentialReturnsItsInput) {
  GPipe gpipe(torch::nn::Sequential(), GPipeOptions({}));
  const torch::Tensor x = torch::randn({3, 2});
  EXPECT_TRUE(gpipe->forward(x).is_same(x));
  EXPECT_EQ(gpipe->size(), 0);
  EXPECT_TRUE(gpipe->devices().empty());
}

TEST(GPipeTransparency, EvalModeMatchesAndKeepsNoGraphUnderNoGrad) {
  torch::manual_seed(3);
  auto model = testing::mlp6();
  auto plain = deep_copy(model);
  GPipe gpipe(model, GPipeOptions({3, 3}).chunks(4));
  gpipe->eval();
  plain->eval();
  const torch::Tensor x = torch::randn({8, 8});
  torch::NoGradGuard no_grad;
  const torch::Tensor out = gpipe->forward(x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(torch::allclose(out, plain->forward(x), 1e-6, 1e-7));
}

TEST(GPipeTransparency, FewerRowsThanChunksMakesFewerMicroBatches) {
  torch::manual_seed(4);
  auto model = testing::mlp6();
  auto plain = deep_copy(model);
  const torch::Tensor x = torch::randn({2, 8});
  GPipe gpipe(model, GPipeOptions({3, 3}).chunks(4));
  gpipe->forward(x).sum().backward();
  plain->forward(x).sum().backward();
  expect_close(grads(*gpipe), grads(*plain), "2 rows, 4 chunks");
}

TEST(GPipeTransparency, SeveralStepsOfSgdTrackThePlainModel) {
  torch::manual_seed(5);
  auto model = testing::mlp6();
  auto plain = deep_copy(model);
  GPipe gpipe(model, GPipeOptions({2, 2, 2}).chunks(4));
  torch::optim::SGD opt_pipe(gpipe->parameters(), 0.1);
  torch::optim::SGD opt_plain(plain->parameters(), 0.1);
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 4});
  for (int step = 0; step < 5; ++step) {
    opt_pipe.zero_grad();
    opt_plain.zero_grad();
    torch::mse_loss(gpipe->forward(x), y).backward();
    torch::mse_loss(plain->forward(x), y).backward();
    opt_pipe.step();
    opt_plain.step();
  }
  std::vector<torch::Tensor> a, b;
  for (const auto& p : gpipe->parameters()) a.push_back(p.detach());
  for (const auto& p : plain->parameters()) b.push_back(p.detach());
  expect_close(a, b, "parameters after 5 steps");
}

}  // namespace
}  // namespace pipetrain
