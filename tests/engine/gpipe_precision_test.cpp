// GPipe under the caller's autocast (bf16): the workers compute in the caller's precision, in
// every checkpoint mode, and two steps with an optimizer step between them equal the plain model
// run micro-batch by micro-batch under the same autocast (a cast cached in a worker across the
// step would reuse the old weights).
#include <gtest/gtest.h>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/runtime/autocast.h"

namespace pipetrain {
namespace {

torch::nn::Sequential bf16_model() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 3));
}

class GPipePrecision : public ::testing::TestWithParam<Checkpoint> {};

TEST_P(GPipePrecision, Bf16UnderTheCallersAutocastEqualsThePlainModel) {
  constexpr int64_t kChunks = 4;
  auto plain = bf16_model();
  // LibTorch's bf16 products, as the plain model's (the fast-path Linear's native bf16 kernels
  // add the bias in float32: closer to float32, not bit-equal to LibTorch's).
  GPipe gpipe(bf16_model(),
              GPipeOptions({2, 3}).chunks(kChunks).checkpoint(GetParam()).deferred_linear(false));
  torch::optim::SGD opt_plain(plain->parameters(), 0.1), opt_pipe(gpipe->parameters(), 0.1);
  for (int step = 0; step < 2; ++step) {
    const auto x = torch::randn({16, 6}), y = torch::randn({16, 3});
    opt_plain.zero_grad();
    opt_pipe.zero_grad();
    double plain_loss = 0;
    const auto xs = x.chunk(kChunks), ys = y.chunk(kChunks);
    for (int64_t c = 0; c < kChunks; ++c) {
      torch::Tensor loss;
      {
        runtime::AutocastScope bf16(torch::kCPU, torch::kBFloat16);
        loss = torch::mse_loss(plain->forward(xs[c]).to(torch::kFloat), ys[c]) / static_cast<double>(kChunks);
      }
      plain_loss += loss.item<double>();
      loss.backward();
    }
    torch::Tensor out;
    {
      runtime::AutocastScope bf16(torch::kCPU, torch::kBFloat16);
      out = gpipe->forward(x);
    }
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16) << "the workers computed in the caller's precision";
    const auto loss = torch::mse_loss(out.to(torch::kFloat), y);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), plain_loss, 1e-5 * std::abs(plain_loss)) << "step " << step;
    const auto a = gpipe->parameters(), b = plain->parameters();
    for (size_t k = 0; k < a.size(); ++k) {
      ASSERT_EQ(a[k].grad().scalar_type(), torch::kFloat) << "float32 master weights and gradients";
      EXPECT_TRUE(torch::allclose(a[k].grad(), b[k].grad(), 1e-4, 1e-6))
          << "step " << step << " parameter " << k << ": " << (a[k].grad() - b[k].grad()).abs().max().item<double>();
    }
    opt_plain.step();
    opt_pipe.step();
  }
}

// The fast path's own bf16 products: within bf16's rounding of the plain model's, step after
// step (the cached bf16 weights follow the optimizer's in-place updates).
TEST(GPipeFastPathPrecision, Bf16StaysWithinBf16RoundingOfThePlainModel) {
  auto plain = bf16_model();
  GPipe gpipe(bf16_model(), GPipeOptions({2, 3}).chunks(4).checkpoint(Checkpoint::Never));
  torch::optim::SGD opt_plain(plain->parameters(), 0.1), opt_pipe(gpipe->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({16, 6}), y = torch::randn({16, 3});
    opt_plain.zero_grad();
    opt_pipe.zero_grad();
    torch::Tensor out, ref;
    {
      runtime::AutocastScope bf16(torch::kCPU, torch::kBFloat16);
      out = gpipe->forward(x);
      ref = plain->forward(x);
    }
    torch::mse_loss(out.to(torch::kFloat), y).backward();
    torch::mse_loss(ref.to(torch::kFloat), y).backward();
    EXPECT_TRUE(torch::allclose(out.to(torch::kFloat), ref.to(torch::kFloat), 2e-2, 2e-2)) << "step " << step;
    const auto a = gpipe->parameters(), b = plain->parameters();
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_TRUE(torch::allclose(a[k].grad(), b[k].grad(), 3e-2, 3e-3))
          << "step " << step << " parameter " << k << ": " << (a[k].grad() - b[k].grad()).abs().max().item<double>();
    }
    opt_plain.step();
    opt_pipe.step();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GPipePrecision,
                         ::testing::Values(Checkpoint::Never, Checkpoint::ExceptLast, Checkpoint::Always),
                         [](const auto& info) {
                           return std::string(info.param == Checkpoint::Never        ? "never"
                                              : info.param == Checkpoint::Always     ? "always"
                                                                                     : "except_last");
                         });

}  // namespace
}  // namespace pipetrain
