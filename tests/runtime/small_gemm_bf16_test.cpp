// The bf16 kernels against float64 products of the same bf16 values, on every shape (odd
// reductions, ragged panels and tiles included), and their accumulator's split-invariance.
#include "pipetrain/runtime/small_gemm_bf16.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>

#include "pipetrain/error.h"
#include "pipetrain/runtime/small_gemm.h"
#include "support/tolerance.h"

namespace pipetrain::runtime {
namespace {

using Shape = std::tuple<int64_t, int64_t, int64_t>;  // rows, in features, out features

torch::Tensor bf16_randn(std::vector<int64_t> sizes) { return torch::randn(sizes).to(torch::kBFloat16); }
torch::Tensor d(const torch::Tensor& t) { return t.to(torch::kDouble); }

// A bf16 result of float32 sums of `terms` exact products, rounded once: within the float32
// summation bound plus half a bf16 unit of the exact value (2^-8 relative, doubled for the
// double rounding of a sum that lands near a bf16 tie).
::testing::AssertionResult bf16_close(const torch::Tensor& got, const torch::Tensor& exact,
                                      const torch::Tensor& abs_terms, int64_t terms) {
  if (got.scalar_type() != torch::kBFloat16) return ::testing::AssertionFailure() << "got " << got.scalar_type();
  if (got.sizes() != exact.sizes()) return ::testing::AssertionFailure() << got.sizes() << " vs " << exact.sizes();
  if (got.numel() == 0) return ::testing::AssertionSuccess();
  const double eps = std::numeric_limits<float>::epsilon();
  const auto bound = 2.0 * (terms + 1) * eps * abs_terms + std::ldexp(1.0, -8) * exact.abs() + 1e-30;
  const auto err = (d(got) - exact).abs();
  const double excess = (err / bound).max().item<double>();
  if (excess <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err.max().item<double>() << " is " << excess
                                       << "x the bound";
}

class SmallGemmBf16Test : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!native_bf16_available()) GTEST_SKIP() << "no bf16 kernels here: " << native_gemm_summary();
  }
};

TEST_P(SmallGemmBf16Test, ForwardEqualsTheProductOfTheSameValues) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 7 + in * 3 + out);
  const auto x = bf16_randn({m, in}), w = bf16_randn({out, in});
  const auto b = torch::randn({out});
  const auto exact = torch::mm(d(x), d(w).t());
  const auto abs_terms = torch::mm(d(x).abs(), d(w).abs().t());
  EXPECT_TRUE(bf16_close(native_linear_bf16(x, w, b), exact + d(b), abs_terms + d(b).abs(), in + 1)) << "with bias";
  EXPECT_TRUE(bf16_close(native_linear_bf16(x, w, torch::Tensor()), exact, abs_terms, in)) << "without bias";
}

TEST_P(SmallGemmBf16Test, InputGradEqualsTheProductOfTheSameValues) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 5 + in + out * 3);
  const auto dy = bf16_randn({m, out}), w = bf16_randn({out, in});
  PackedPairs packed;
  packed.pack(w);
  EXPECT_EQ(packed.rows(), out);
  EXPECT_EQ(packed.cols(), in);
  EXPECT_TRUE(bf16_close(native_input_grad_bf16(dy, packed), torch::mm(d(dy), d(w)),
                         torch::mm(d(dy).abs(), d(w).abs()), out));
}

// Two parts (7 rows, then m: odd rows pad a pair), rows [0, out/3) taking both in one call and
// the rest one part per call, continuing from existing values; then `fresh`. The pieces must
// give the very bits of one call.
TEST_P(SmallGemmBf16Test, WeightGradAccumulatesInPiecesInFloat32) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 3 + in * 5 + out * 7);
  const auto dy1 = bf16_randn({7, out}), x1 = bf16_randn({7, in});
  const auto dy2 = bf16_randn({m, out}), x2 = bf16_randn({m, in});
  const auto start_w = torch::randn({out, in}), start_b = torch::randn({out});
  const WeightGradPairs a(dy1, x1), b(dy2, x2);
  auto dw = start_w.clone();
  auto db = start_b.clone();
  const int64_t split = out / 3;
  native_weight_grad_bf16(dw.data_ptr<float>(), db.data_ptr<float>(), 0, split, {&a, &b}, false);
  native_weight_grad_bf16(dw.data_ptr<float>(), db.data_ptr<float>(), split, out, {&a}, false);
  native_weight_grad_bf16(dw.data_ptr<float>(), db.data_ptr<float>(), split, out, {&b}, false);
  const auto dy = torch::cat({dy1, dy2}), x = torch::cat({x1, x2});
  const int64_t terms = 1 + 7 + m;
  EXPECT_EQ(dw.scalar_type(), torch::kFloat);
  EXPECT_TRUE(pipetrain::testing::within_sum_bound(dw, d(start_w) + torch::mm(d(dy).t(), d(x)),
                                                   d(start_w).abs() + torch::mm(d(dy).abs().t(), d(x).abs()), terms))
      << "weight";
  EXPECT_TRUE(pipetrain::testing::within_sum_bound(db, d(start_b) + d(dy).sum(0),
                                                   d(start_b).abs() + d(dy).abs().sum(0), terms))
      << "bias";
  auto whole = start_w.clone();
  auto whole_b = start_b.clone();
  native_weight_grad_bf16(whole.data_ptr<float>(), whole_b.data_ptr<float>(), 0, out, {&a, &b}, false);
  EXPECT_TRUE(torch::equal(whole, dw)) << "pieces and one call differ";
  EXPECT_TRUE(torch::equal(whole_b, db)) << "bias: pieces and one call differ";
  auto fresh = torch::full({out, in}, 7.0f);
  native_weight_grad_bf16(fresh.data_ptr<float>(), nullptr, 0, out, {&b}, true);
  EXPECT_TRUE(pipetrain::testing::matmul_close(fresh, d(dy2).t(), d(x2))) << "fresh";
}

// As the float32 tile: the sum of squares returned is that of the float32 values left in dW.
TEST_P(SmallGemmBf16Test, WeightGradSumsTheSquaresItLeaves) {
  const auto [m, in, out] = GetParam();
  torch::manual_seed(m * 11 + in * 13 + out);
  const WeightGradPairs a(bf16_randn({5, out}), bf16_randn({5, in})), b(bf16_randn({m, out}), bf16_randn({m, in}));
  auto dw = torch::randn({out, in});
  auto squares = [&](int64_t r0, int64_t r1) { return d(dw.slice(0, r0, r1)).pow(2).sum().item<double>(); };
  const int64_t split = out / 2;
  double sq = -1;
  native_weight_grad_bf16(dw.data_ptr<float>(), nullptr, 0, split, {&a, &b}, false, &sq);
  EXPECT_NEAR(sq, squares(0, split), 1e-5 * squares(0, split) + 1e-30) << "continued";
  native_weight_grad_bf16(dw.data_ptr<float>(), nullptr, split, out, {&b}, true, &sq);
  EXPECT_NEAR(sq, squares(split, out), 1e-5 * squares(split, out) + 1e-30) << "fresh";
  EXPECT_THROW(native_weight_grad_bf16(dw.data_ptr<float>(), nullptr, 0, out, {}, false, &sq), BatchError);
}

const Shape kBf16Shapes[] = {Shape{32, 1024, 1024}, Shape{1, 1, 1},    Shape{7, 33, 17},  Shape{8, 32, 8},
                         Shape{33, 64, 40},     Shape{70, 100, 31}, Shape{9, 16, 65}, Shape{0, 8, 8},
                         Shape{33, 40, 300},    Shape{13, 24, 13}};

INSTANTIATE_TEST_SUITE_P(Shapes, SmallGemmBf16Test, ::testing::ValuesIn(kBf16Shapes), [](const auto& info) {
  return "m" + std::to_string(std::get<0>(info.param)) + "_in" + std::to_string(std::get<1>(info.param)) + "_out" +
         std::to_string(std::get<2>(info.param));
});

TEST(SmallGemmBf16, StridedInputsAndThreads) {
  if (!native_bf16_available()) GTEST_SKIP() << "no bf16 kernels here";
  const auto x = bf16_randn({64, 48}).t();  // 48 x 64, not contiguous
  const auto w = bf16_randn({96, 64});
  const auto dy = bf16_randn({96, 48}).t();  // 48 x 96
  PackedPairs packed;
  packed.pack(w);
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    EXPECT_TRUE(bf16_close(native_linear_bf16(x, w, torch::Tensor()), torch::mm(d(x), d(w).t()),
                           torch::mm(d(x).abs(), d(w).abs().t()), 64))
        << "threads " << threads;
    EXPECT_TRUE(bf16_close(native_input_grad_bf16(dy, packed), torch::mm(d(dy), d(w)),
                           torch::mm(d(dy).abs(), d(w).abs()), 96))
        << "threads " << threads;
  }
  at::set_num_threads(saved);
}

TEST(SmallGemmBf16, EntryPointsRejectBadOperands) {
  if (!native_bf16_available()) GTEST_SKIP() << "no bf16 kernels here";
  const auto w = bf16_randn({8, 6});
  EXPECT_THROW(native_linear_bf16(bf16_randn({3, 5}), w, torch::Tensor()), BatchError);
  EXPECT_THROW(native_linear_bf16(torch::randn({3, 6}), w, torch::Tensor()), BatchError);  // float32 x
  EXPECT_THROW(native_linear_bf16(bf16_randn({3, 6}), w, bf16_randn({8})), BatchError);   // bias must be float32
  EXPECT_THROW(native_linear_bf16(bf16_randn({3, 6}), w, torch::randn({7})), BatchError);
  PackedPairs packed;
  packed.pack(w);
  EXPECT_THROW(native_input_grad_bf16(bf16_randn({3, 7}), packed), BatchError);
  EXPECT_THROW(native_input_grad_bf16(bf16_randn({3, 8}), PackedPairs()), BatchError);
  EXPECT_THROW(WeightGradPairs(bf16_randn({3, 8}), bf16_randn({4, 6})), BatchError);
  EXPECT_THROW(WeightGradPairs(torch::randn({3, 8}), torch::randn({3, 6})), BatchError);
  const WeightGradPairs a(bf16_randn({3, 8}), bf16_randn({3, 6}));
  const WeightGradPairs other(bf16_randn({3, 9}), bf16_randn({3, 6}));
  auto dw = torch::zeros({8, 6});
  EXPECT_THROW(native_weight_grad_bf16(dw.data_ptr<float>(), nullptr, 0, 8, {&a, &other}, false), BatchError);
  EXPECT_THROW(native_weight_grad_bf16(dw.data_ptr<float>(), nullptr, 0, 9, {&a}, false), BatchError);
  EXPECT_THROW(native_weight_grad_bf16(nullptr, nullptr, 0, 8, {&a}, false), UsageError);
}

// With the native kernels forced to AVX2 or switched off the bf16 kernels are off too, and
// every entry is a ConfigError that says so, never an illegal instruction.
TEST(SmallGemmBf16, OffWhereTheNativeKernelsAreNotOnAvx512) {
  if (!native_bf16_available()) GTEST_SKIP() << "no bf16 kernels here";
  const auto x = bf16_randn({4, 6}), w = bf16_randn({8, 6});
  disable_native_gemm(true);
  EXPECT_FALSE(native_bf16_available());
  EXPECT_THROW(native_linear_bf16(x, w, torch::Tensor()), ConfigError);
  disable_native_gemm(false);
  const GemmIsa saved = native_gemm_isa();
  set_native_gemm_isa(GemmIsa::Avx2);
  EXPECT_FALSE(native_bf16_available());
  try {
    native_linear_bf16(x, w, torch::Tensor());
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("avx2"), std::string::npos) << e.what();
  }
  set_native_gemm_isa(saved);
  EXPECT_TRUE(native_bf16_available());
}

}  // namespace
}  // namespace pipetrain::runtime
