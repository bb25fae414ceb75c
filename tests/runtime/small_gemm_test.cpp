// The AVX-512 Linear kernels equal LibTorch's products on every shape, tails included.
#include "pipetrain/runtime/small_gemm.h"

#include <gtest/gtest.h>

#include <tuple>

namespace pipetrain::runtime {
namespace {

// rows, in features, out features
using Shape = std::tuple<int64_t, int64_t, int64_t>;

class SmallGemmTest : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!native_gemm_available()) GTEST_SKIP() << "this CPU lacks AVX-512F";
  }
};

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  // float32 sums over up to 1024 terms in another order
  EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/1e-4, /*atol=*/1e-4))
      << what << ": max difference " << (got - want).abs().max().item<float>();
}

TEST_P(SmallGemmTest, ForwardEqualsAddmm) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 7 + in * 3 + out);
  const auto x = torch::randn({m, in});
  const auto w = torch::randn({out, in});
  const auto b = torch::randn({out});
  expect_close(native_linear(x, w, b), torch::addmm(b, x, w.t()), "with bias");
  expect_close(native_linear(x, w, torch::Tensor()), torch::mm(x, w.t()), "without bias");
}

TEST_P(SmallGemmTest, InputGradEqualsMm) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 5 + in + out * 3);
  const auto dy = torch::randn({m, out});
  const auto w = torch::randn({out, in});
  const PackedWeight packed(w);
  EXPECT_EQ(packed.out_features(), out);
  EXPECT_EQ(packed.in_features(), in);
  expect_close(native_input_grad(dy, packed), torch::mm(dy, w), "dy W");
}

INSTANTIATE_TEST_SUITE_P(Shapes, SmallGemmTest,
                         ::testing::Values(Shape{32, 1024, 1024}, Shape{1, 1, 1}, Shape{7, 33, 17},
                                           Shape{8, 32, 8}, Shape{33, 64, 40}, Shape{70, 100, 31},
                                           Shape{9, 16, 65}, Shape{0, 8, 8}),
                         [](const auto& info) {
                           return "m" + std::to_string(std::get<0>(info.param)) + "_in" +
                                  std::to_string(std::get<1>(info.param)) + "_out" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(SmallGemm, StridedInputsAndThreads) {
  if (!native_gemm_available()) GTEST_SKIP() << "this CPU lacks AVX-512F";
  const auto x = torch::randn({64, 48}).t();  // 48 x 64, not contiguous
  const auto w = torch::randn({96, 64});
  const auto b = torch::randn({96});
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    expect_close(native_linear(x, w, b), torch::addmm(b, x, w.t()), "strided x");
    const auto dy = torch::randn({96, 48}).t();  // 48 x 96
    expect_close(native_input_grad(dy, PackedWeight(w)), torch::mm(dy, w), "strided dy");
  }
  at::set_num_threads(saved);
}

}  // namespace
}  // namespace pipetrain::runtime
