// The Linear fast path gives autograd's gradients, with weight gradients fused later.
#include "pipetrain/runtime/deferred_linear.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "pipetrain/error.h"
#include "pipetrain/runtime/autocast.h"
#include "pipetrain/runtime/small_gemm.h"
#include "pipetrain/runtime/small_gemm_bf16.h"
#include "support/tolerance.h"

namespace pipetrain::runtime {
namespace {

class DeferredLinearTest : public ::testing::TestWithParam<GemmKernel> {
 protected:
  void SetUp() override {
    if (GetParam() == GemmKernel::Native && !native_gemm_available()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 and FMA";
  }
};

// Both sides are float32 sums of the same terms in another order (fused over micro-batches,
// another kernel). These layers are small (at most 70 terms a sum) and their terms are of the
// size of the results, so the difference stays within rtol 1e-4 of the larger side plus 1e-5
// of the tensor's scale; the native accumulator's own test below checks against the bound.
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_TRUE(b.defined()) << what;
  const double scale = std::max(a.abs().max().item<double>(), b.abs().max().item<double>());
  EXPECT_TRUE(torch::allclose(a, b, /*rtol=*/1e-4, /*atol=*/1e-5 * scale + 1e-30))
      << what << ": max difference " << (a - b).abs().max().item<float>() << " at scale " << scale;
}

TEST_P(DeferredLinearTest, GradientsEqualAutogradOverMicroBatches) {
  torch::manual_seed(0);
  torch::nn::Linear ref1(16, 32), ref2(32, 8);
  torch::nn::Linear fast1(16, 32), fast2(32, 8);
  {
    torch::NoGradGuard g;
    fast1->weight.copy_(ref1->weight);
    fast1->bias.copy_(ref1->bias);
    fast2->weight.copy_(ref2->weight);
    fast2->bias.copy_(ref2->bias);
  }
  DeferredLinear d1(fast1, GetParam()), d2(fast2, GetParam());
  const auto x = torch::randn({12, 16});
  const auto target = torch::randn({12, 8});
  const auto xs = x.chunk(4), ts = target.chunk(4);
  std::vector<torch::Tensor> input_grads;
  for (int64_t mb = 0; mb < 4; ++mb) {
    auto ref_in = xs[mb].clone().requires_grad_();
    torch::mse_loss(ref2(torch::relu(ref1(ref_in))), ts[mb]).backward();
    auto in = xs[mb].clone().requires_grad_();
    auto y = d2.forward(torch::relu(d1.forward(in, mb)), mb);
    torch::mse_loss(y, ts[mb]).backward();
    EXPECT_FALSE(fast1->weight.grad().defined()) << "weight gradient must wait for backward_weight";
    expect_close(in.grad(), ref_in.grad(), "input gradient");
  }
  EXPECT_EQ(d1.pending(), (std::vector<int64_t>{0, 1, 2, 3}));
  d1.backward_weight({0, 1});
  d1.backward_weight({2, 3});
  d2.backward_weight({0, 1, 2, 3});
  EXPECT_TRUE(d1.pending().empty());
  expect_close(fast1->weight.grad(), ref1->weight.grad(), "layer 1 weight");
  expect_close(fast1->bias.grad(), ref1->bias.grad(), "layer 1 bias");
  expect_close(fast2->weight.grad(), ref2->weight.grad(), "layer 2 weight");
  expect_close(fast2->bias.grad(), ref2->bias.grad(), "layer 2 bias");
}

// Under bf16 autocast the native kernel takes the bf16 kernels: y and dx are theirs to the bit,
// and the weight gradient queues in the native accumulator (so it can fill waits) and sums in
// float32, within the float32 bound of the exact sum of the same bf16 values.
TEST(DeferredLinearBf16, TakesTheBf16KernelsAndSumsTheWeightGradientInFloat32) {
  if (!native_bf16_available()) GTEST_SKIP() << "no bf16 kernels here: " << native_gemm_summary();
  torch::manual_seed(3);
  torch::nn::Linear layer(64, 48);
  DeferredLinear d(layer, GemmKernel::Native);
  const auto w16 = layer->weight.detach().to(torch::kBFloat16);
  PackedPairs packed;
  packed.pack(w16);
  std::vector<torch::Tensor> xs, dys;
  for (int64_t mb = 0; mb < 3; ++mb) {
    const auto x = torch::randn({32 + mb, 64});
    const auto g = torch::randn({32 + mb, 48});
    auto in = x.clone().requires_grad_();
    torch::Tensor y;
    {
      AutocastScope autocast(torch::kCPU, torch::kBFloat16);
      y = d.forward(in, mb);
    }
    ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
    const auto x16 = x.to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(y.detach(), native_linear_bf16(x16, w16, layer->bias.detach()))) << "forward";
    y.backward(g.to(torch::kBFloat16));
    const auto dy16 = g.to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(in.grad(), native_input_grad_bf16(dy16, packed).to(torch::kFloat))) << "input gradient";
    EXPECT_TRUE(d.has_queued_weight_work()) << "the weight gradient waits in the native accumulator";
    xs.push_back(x16);
    dys.push_back(dy16);
  }
  d.accumulate_all();
  EXPECT_TRUE(d.pending().empty());
  ASSERT_EQ(layer->weight.grad().scalar_type(), torch::kFloat);
  const auto x = torch::cat(xs).to(torch::kDouble), dy = torch::cat(dys).to(torch::kDouble);
  EXPECT_TRUE(pipetrain::testing::within_sum_bound(layer->weight.grad(), torch::mm(dy.t(), x),
                                                   torch::mm(dy.abs().t(), x.abs()), x.size(0)));
  EXPECT_TRUE(pipetrain::testing::within_sum_bound(layer->bias.grad(), dy.sum(0), dy.abs().sum(0), x.size(0)));
  const double squares = layer->weight.grad().to(torch::kDouble).pow(2).sum().item<double>();
  ASSERT_TRUE(d.weight_grad_sqnorm()) << "the bf16 kernel sums the squares too";
  EXPECT_NEAR(*d.weight_grad_sqnorm(), squares, 1e-5 * squares);
}

TEST_P(DeferredLinearTest, SequenceInputsAndNoInputGradient) {
  torch::manual_seed(1);
  torch::nn::Linear ref(6, 5), fast(6, 5);
  {
    torch::NoGradGuard g;
    fast->weight.copy_(ref->weight);
    fast->bias.copy_(ref->bias);
  }
  DeferredLinear d(fast, GetParam());
  const auto x = torch::randn({2, 3, 6});  // (batch, time, features), no gradient wanted
  ref(x).pow(2).sum().backward();
  auto y = d.forward(x, 7);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 5}));
  y.pow(2).sum().backward();
  d.backward_weight({7});
  expect_close(fast->weight.grad(), ref->weight.grad(), "weight");
  expect_close(fast->bias.grad(), ref->bias.grad(), "bias");
}

TEST_P(DeferredLinearTest, NoGradForwardKeepsNothing) {
  torch::nn::Linear fast(4, 3);
  DeferredLinear d(fast, GetParam());
  torch::NoGradGuard g;
  const auto x = torch::randn({5, 4});
  expect_close(d.forward(x, 0), fast(x), "output");
  EXPECT_THROW(d.backward_weight({0}), ScheduleError);
}

TEST_P(DeferredLinearTest, TracksWeightUpdates) {
  torch::nn::Linear fast(4, 3);
  DeferredLinear d(fast, GetParam());
  const auto x = torch::randn({2, 4});
  torch::NoGradGuard g;
  d.forward(x, 0);
  fast->weight.add_(1.0);  // an optimizer step changes the weight in place
  expect_close(d.forward(x, 0), fast(x), "output after update");
}

// A gradient already in .grad is added to; one the caller kept from the last step is not
// written over by the next (the accumulator reuses its buffer only when nobody holds it).
TEST_P(DeferredLinearTest, AddsToAnExistingGradientAndLeavesAKeptOneAlone) {
  torch::manual_seed(3);
  torch::nn::Linear ref(40, 70), fast(40, 70);
  {
    torch::NoGradGuard g;
    fast->weight.copy_(ref->weight);
    fast->bias.copy_(ref->bias);
  }
  DeferredLinear d(fast, GetParam());
  auto step = [&](const torch::Tensor& x) {
    ref(x).pow(2).sum().backward();
    d.forward(x.clone().requires_grad_(), 0).pow(2).sum().backward();
    d.backward_weight({0});
  };
  const auto x1 = torch::randn({9, 40});
  step(x1);
  step(torch::randn({5, 40}));  // accumulates: .grad holds both steps
  expect_close(fast->weight.grad(), ref->weight.grad(), "accumulated weight");
  expect_close(fast->bias.grad(), ref->bias.grad(), "accumulated bias");
  const auto kept = fast->weight.grad();
  const auto kept_copy = kept.clone();

  fast->weight.mutable_grad() = torch::Tensor();  // a new step, as the engine starts one
  fast->bias.mutable_grad() = torch::Tensor();
  ref->zero_grad();
  const auto x3 = torch::randn({4, 40});
  step(x3);
  expect_close(fast->weight.grad(), ref->weight.grad(), "fresh weight");
  EXPECT_FALSE(kept.is_same(fast->weight.grad()));
  EXPECT_TRUE(torch::equal(kept, kept_copy)) << "a gradient the caller kept was overwritten";
}

// The native accumulator's kernel sums its gradient's squares on the way; that sum is offered
// only while it still describes .grad: whole (every row block written this step), untouched
// since (no in-place op), not replaced, and only on the native path (bf16: the test above).
TEST_P(DeferredLinearTest, OffersTheGradientSquaresItsKernelSummed) {
  torch::manual_seed(5);
  torch::nn::Linear fast(40, 300);  // three row blocks, the last one ragged
  DeferredLinear d(fast, GetParam());
  auto backward = [&](int64_t mb) {
    d.forward(torch::randn({6, 40}).requires_grad_(), mb).pow(2).sum().backward();
  };
  auto squares = [&] { return fast->weight.grad().to(torch::kDouble).pow(2).sum().item<double>(); };
  backward(0);
  backward(1);
  EXPECT_FALSE(d.weight_grad_sqnorm()) << "no gradient yet";
  if (GetParam() != GemmKernel::Native) {
    d.backward_weight({0, 1});
    EXPECT_FALSE(d.weight_grad_sqnorm()) << "the product path sums nothing";
    return;
  }
  ASSERT_TRUE(d.accumulate_some(1));
  EXPECT_FALSE(d.weight_grad_sqnorm()) << "two row blocks have not been written this step";
  d.backward_weight({0, 1});
  ASSERT_TRUE(d.weight_grad_sqnorm());
  EXPECT_NEAR(*d.weight_grad_sqnorm(), squares(), 1e-5 * squares());

  fast->weight.mutable_grad().mul_(0.5);  // clipping, say
  EXPECT_FALSE(d.weight_grad_sqnorm()) << "changed in place since";

  fast->weight.mutable_grad() = torch::Tensor();  // the next step
  fast->bias.mutable_grad() = torch::Tensor();
  backward(2);
  d.backward_weight({2});
  ASSERT_TRUE(d.weight_grad_sqnorm());
  EXPECT_NEAR(*d.weight_grad_sqnorm(), squares(), 1e-5 * squares());
  fast->weight.mutable_grad() = fast->weight.grad().clone();
  EXPECT_FALSE(d.weight_grad_sqnorm()) << "replaced";
}

INSTANTIATE_TEST_SUITE_P(Kernels, DeferredLinearTest,
                         ::testing::Values(GemmKernel::Blas, GemmKernel::OneDnn, GemmKernel::Native),
                         [](const auto& info) { return to_string(info.param); });

TEST(Gemm, KernelsAgree) {
  const auto a = torch::randn({32, 64});
  const auto b = torch::randn({64, 48});
  EXPECT_TRUE(pipetrain::testing::matmul_close(gemm(a, b, GemmKernel::OneDnn), a, b)) << "oneDNN";
  EXPECT_TRUE(pipetrain::testing::matmul_close(gemm(a.t().contiguous().t(), b, GemmKernel::OneDnn), a, b))
      << "strided A";
  const auto d = torch::randn({4, 4}, torch::kDouble);
  EXPECT_TRUE(torch::equal(gemm(d, d, GemmKernel::OneDnn), torch::mm(d, d)));
}

TEST(Gemm, NativeAskedForByValueWithoutKernelsIsAConfigError) {
  disable_native_gemm(true);  // as on a CPU without AVX-512F or AVX2
  EXPECT_THROW(DeferredLinear(torch::nn::Linear(4, 3), GemmKernel::Native), ConfigError);
  EXPECT_THROW(parse_gemm_kernel("native"), ConfigError);
  EXPECT_NE(parse_gemm_kernel("auto"), GemmKernel::Native);
  disable_native_gemm(false);
}

TEST(Gemm, ParsesKernelNames) {
  EXPECT_EQ(parse_gemm_kernel("blas"), GemmKernel::Blas);
  const GemmKernel best = native_gemm_available() ? GemmKernel::Native
                          : onednn_available()    ? GemmKernel::OneDnn
                                                  : GemmKernel::Blas;
  EXPECT_EQ(parse_gemm_kernel("auto"), best);
  if (native_gemm_available()) {
    EXPECT_EQ(parse_gemm_kernel("native"), GemmKernel::Native);
  }
  try {
    parse_gemm_kernel("cublas");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"cublas\""), std::string::npos);
  }
}

}  // namespace
}  // namespace pipetrain::runtime
