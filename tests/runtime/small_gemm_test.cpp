// The AVX-512 Linear kernels equal LibTorch's products on every shape, tails included.
#include "pipetrain/runtime/small_gemm.h"

#include <gtest/gtest.h>

#include <tuple>

#include "pipetrain/error.h"
#include "support/tolerance.h"

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

using pipetrain::testing::matmul_close;
using pipetrain::testing::within_sum_bound;

// x W^T + b, with the bias as one more term of each sum.
::testing::AssertionResult linear_close(const torch::Tensor& got, const torch::Tensor& x, const torch::Tensor& w,
                                        const torch::Tensor& b) {
  const auto xd = x.to(torch::kDouble), wd = w.to(torch::kDouble);
  auto exact = torch::mm(xd, wd.t());
  auto abs_terms = torch::mm(xd.abs(), wd.abs().t());
  if (b.defined()) {
    exact = exact + b.to(torch::kDouble);
    abs_terms = abs_terms + b.to(torch::kDouble).abs();
  }
  return within_sum_bound(got, exact, abs_terms, x.size(1) + 1);
}

TEST_P(SmallGemmTest, ForwardEqualsAddmm) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 7 + in * 3 + out);
  const auto x = torch::randn({m, in});
  const auto w = torch::randn({out, in});
  const auto b = torch::randn({out});
  EXPECT_TRUE(linear_close(native_linear(x, w, b), x, w, b)) << "with bias";
  EXPECT_TRUE(linear_close(native_linear(x, w, torch::Tensor()), x, w, torch::Tensor())) << "without bias";
}

TEST_P(SmallGemmTest, InputGradEqualsMm) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 5 + in + out * 3);
  const auto dy = torch::randn({m, out});
  const auto w = torch::randn({out, in});
  const PackedWeight packed(w);
  EXPECT_EQ(packed.out_features(), out);
  EXPECT_EQ(packed.in_features(), in);
  EXPECT_TRUE(matmul_close(native_input_grad(dy, packed), dy, w)) << "dy W";
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
    EXPECT_TRUE(linear_close(native_linear(x, w, b), x, w, b)) << "strided x";
    const auto dy = torch::randn({96, 48}).t();  // 48 x 96
    EXPECT_TRUE(matmul_close(native_input_grad(dy, PackedWeight(w)), dy, w)) << "strided dy";
  }
  at::set_num_threads(saved);
}

// A bias that is a strided view: its contiguous copy must live as long as the kernel reads it.
TEST(SmallGemm, NonContiguousBias) {
  if (!native_gemm_available()) GTEST_SKIP() << "this CPU lacks AVX-512F";
  const auto x = torch::randn({5, 24});
  const auto w = torch::randn({40, 24});
  const auto every_other = torch::randn({80}).slice(0, 0, 80, 2);
  ASSERT_FALSE(every_other.is_contiguous());
  for (int k = 0; k < 3; ++k) {
    torch::randn({4096});  // churn the allocator: a freed copy would be overwritten
    EXPECT_TRUE(linear_close(native_linear(x, w, every_other), x, w, every_other));
  }
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Each public entry checks its operands before a kernel reads them.
TEST(SmallGemm, EntryPointsRejectBadOperands) {
  if (!native_gemm_available()) GTEST_SKIP() << "this CPU lacks AVX-512F";
  const auto w = torch::randn({8, 6});
  EXPECT_THROW(native_linear(torch::randn({3, 5}), w, torch::Tensor()), BatchError);
  EXPECT_THROW(native_linear(torch::randn({3, 6}), w, torch::randn({7})), BatchError);
  EXPECT_THROW(native_linear(torch::randn({3, 6}, torch::kDouble), w, torch::Tensor()), BatchError);
  EXPECT_THROW(native_linear(torch::randn({2, 3, 6}), w, torch::Tensor()), BatchError);
  EXPECT_NE(error_of([&] { native_linear(torch::randn({3, 5}), w, torch::Tensor()); }).find("x [3, 5], weight [8, 6]"),
            std::string::npos);
  EXPECT_THROW(native_input_grad(torch::randn({3, 7}), PackedWeight(w)), BatchError);
  EXPECT_THROW(native_input_grad(torch::randn({3, 8}), PackedWeight()), BatchError);
  EXPECT_THROW(WeightGradOperands(torch::randn({3, 8}), torch::randn({4, 6})), BatchError);
  EXPECT_THROW(WeightGradOperands(torch::randn({3, 8}), torch::Tensor()), BatchError);
  const WeightGradOperands a(torch::randn({3, 8}), torch::randn({3, 6}));
  const WeightGradOperands other(torch::randn({3, 9}), torch::randn({3, 6}));
  auto dw = torch::zeros({8, 6});
  EXPECT_THROW(native_weight_grad(dw.data_ptr<float>(), nullptr, 0, 8, {&a, &other}, false), BatchError);
  EXPECT_THROW(native_weight_grad(dw.data_ptr<float>(), nullptr, 0, 9, {&a}, false), BatchError);
  EXPECT_THROW(native_weight_grad(dw.data_ptr<float>(), nullptr, 5, 4, {&a}, false), BatchError);
  EXPECT_THROW(native_weight_grad(nullptr, nullptr, 0, 8, {&a}, false), UsageError);
}

// Where the CPU lacks AVX-512 (simulated by switching the kernels off) every entry is a
// ConfigError naming the fix, never an illegal instruction.
TEST(SmallGemm, WithoutAvx512EveryEntryRefusesByName) {
  disable_native_gemm(true);
  const auto x = torch::randn({3, 6}), w = torch::randn({8, 6});
  const std::string linear = error_of([&] { native_linear(x, w, torch::Tensor()); });
  const std::string input = error_of([&] { native_input_grad(torch::randn({3, 8}), PackedWeight(w)); });
  const WeightGradOperands a(torch::randn({3, 8}), x);
  auto dw = torch::zeros({8, 6});
  const std::string weight = error_of([&] { native_weight_grad(dw.data_ptr<float>(), nullptr, 0, 8, {&a}, false); });
  const bool native_after = native_gemm_available();
  disable_native_gemm(false);
  EXPECT_FALSE(native_after);
  for (const auto& [who, what] : {std::pair{"native_linear", linear}, {"native_input_grad", input},
                                  {"native_weight_grad", weight}}) {
    EXPECT_NE(what.find(who), std::string::npos) << what;
    EXPECT_NE(what.find("AVX-512F"), std::string::npos) << what;
    EXPECT_NE(what.find("auto"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace pipetrain::runtime
