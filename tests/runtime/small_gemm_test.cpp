// The native Linear kernels equal LibTorch's products on every shape, tails included, on each
// instruction set this CPU has (AVX-512, and AVX2 forced), and the two give the same bits.
#include "pipetrain/runtime/small_gemm.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <tuple>
#include <vector>

#include "pipetrain/error.h"
#include "support/tolerance.h"

namespace pipetrain::runtime {

// For GoogleTest's parameter names in failures (found by argument-dependent lookup).
void PrintTo(GemmIsa isa, std::ostream* os) { *os << to_string(isa); }

namespace {

// rows, in features, out features
using Shape = std::tuple<int64_t, int64_t, int64_t>;

// Runs the kernels on `isa` until the end of the scope (then on what was in use before).
class ScopedGemmIsa {
 public:
  explicit ScopedGemmIsa(GemmIsa isa) : saved_(native_gemm_isa()) { set_native_gemm_isa(isa); }
  ~ScopedGemmIsa() { set_native_gemm_isa(saved_); }
  ScopedGemmIsa(const ScopedGemmIsa&) = delete;
  ScopedGemmIsa& operator=(const ScopedGemmIsa&) = delete;

 private:
  GemmIsa saved_;
};

bool cpu_has(GemmIsa isa) { return static_cast<int>(isa) <= static_cast<int>(cpu_gemm_isa()); }

const GemmIsa kIsas[] = {GemmIsa::Avx512, GemmIsa::Avx2};

class SmallGemmTest : public ::testing::TestWithParam<std::tuple<GemmIsa, Shape>> {
 protected:
  void SetUp() override {
    const GemmIsa isa = std::get<0>(GetParam());
    if (!cpu_has(isa)) GTEST_SKIP() << "this CPU lacks " << to_string(isa);
    isa_.emplace(isa);
    ASSERT_EQ(native_gemm_isa(), isa);
    ASSERT_TRUE(native_gemm_available());
  }
  void TearDown() override { isa_.reset(); }
  Shape shape() const { return std::get<1>(GetParam()); }

 private:
  std::optional<ScopedGemmIsa> isa_;
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
  const auto [m, in, out] = shape();
  torch::manual_seed(m * 7 + in * 3 + out);
  const auto x = torch::randn({m, in});
  const auto w = torch::randn({out, in});
  const auto b = torch::randn({out});
  EXPECT_TRUE(linear_close(native_linear(x, w, b), x, w, b)) << "with bias";
  EXPECT_TRUE(linear_close(native_linear(x, w, torch::Tensor()), x, w, torch::Tensor())) << "without bias";
}

TEST_P(SmallGemmTest, InputGradEqualsMm) {
  const auto [m, in, out] = shape();
  torch::manual_seed(m * 5 + in + out * 3);
  const auto dy = torch::randn({m, out});
  const auto w = torch::randn({out, in});
  const PackedWeight packed(w);
  EXPECT_EQ(packed.out_features(), out);
  EXPECT_EQ(packed.in_features(), in);
  EXPECT_TRUE(matmul_close(native_input_grad(dy, packed), dy, w)) << "dy W";
}

// The weight-gradient accumulator against float64: two parts (7 rows, then m), partial panels
// and partial last tiles, rows [0, out/3) taking both parts in one call and the rest one part per
// call, continuing from existing values; then `fresh` ignoring what dW held.
TEST_P(SmallGemmTest, WeightGradAccumulatesInPieces) {
  const auto [m, in, out] = shape();
  torch::manual_seed(m * 3 + in * 5 + out * 7);
  const auto dy1 = torch::randn({7, out}), x1 = torch::randn({7, in});
  const auto dy2 = torch::randn({m, out}), x2 = torch::randn({m, in});
  const auto start_w = torch::randn({out, in}), start_b = torch::randn({out});
  const WeightGradOperands a(dy1, x1), b(dy2, x2);
  auto dw = start_w.clone();
  auto db = start_b.clone();
  const int64_t split = out / 3;
  native_weight_grad(dw.data_ptr<float>(), db.data_ptr<float>(), 0, split, {&a, &b}, false);
  native_weight_grad(dw.data_ptr<float>(), db.data_ptr<float>(), split, out, {&a}, false);
  native_weight_grad(dw.data_ptr<float>(), db.data_ptr<float>(), split, out, {&b}, false);
  // 1 + 7 + m terms per element, some of which cancel: the float32 summation bound, not a
  // fixed atol (which failed at random under ctest -j2).
  auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const auto dy = torch::cat({dy1, dy2}), x = torch::cat({x1, x2});
  const int64_t terms = 1 + 7 + m;
  EXPECT_TRUE(pipetrain::testing::within_sum_bound(dw, d(start_w) + torch::mm(d(dy).t(), d(x)),
                                                   d(start_w).abs() + torch::mm(d(dy).abs().t(), d(x).abs()), terms))
      << "weight";
  EXPECT_TRUE(pipetrain::testing::within_sum_bound(db, d(start_b) + d(dy).sum(0),
                                                   d(start_b).abs() + d(dy).abs().sum(0), terms))
      << "bias";
  auto fresh = torch::full({out, in}, 7.0f);
  native_weight_grad(fresh.data_ptr<float>(), nullptr, 0, out, {&b}, true);
  EXPECT_TRUE(matmul_close(fresh, dy2.t(), x2)) << "fresh";
}

// The sum of squares the weight-gradient tiles return equals that of the values they left in
// dW, for each call's rows: continued, in pieces, fresh, with ragged tiles (whose lanes past the
// matrix must not count).
TEST_P(SmallGemmTest, WeightGradSumsTheSquaresItLeaves) {
  const auto [m, in, out] = shape();
  torch::manual_seed(m * 11 + in * 13 + out);
  const auto dy1 = torch::randn({5, out}), x1 = torch::randn({5, in});
  const auto dy2 = torch::randn({m, out}), x2 = torch::randn({m, in});
  const WeightGradOperands a(dy1, x1), b(dy2, x2);
  auto dw = torch::randn({out, in});
  auto squares = [&](int64_t r0, int64_t r1) { return dw.slice(0, r0, r1).to(torch::kDouble).pow(2).sum().item<double>(); };
  auto expect_sum = [&](double got, int64_t r0, int64_t r1, const char* what) {
    const double want = squares(r0, r1);
    // float32 sums of at most one tile's squares (8 x 32), then float64.
    EXPECT_NEAR(got, want, 1e-5 * want + 1e-30) << what << ", rows [" << r0 << ", " << r1 << ")";
  };
  const int64_t split = out / 2;
  double sq = -1;
  native_weight_grad(dw.data_ptr<float>(), nullptr, 0, split, {&a}, false, &sq);
  expect_sum(sq, 0, split, "continued from random values");
  native_weight_grad(dw.data_ptr<float>(), nullptr, 0, split, {&b}, false, &sq);
  expect_sum(sq, 0, split, "a second part");
  native_weight_grad(dw.data_ptr<float>(), nullptr, split, out, {&a, &b}, true, &sq);
  expect_sum(sq, split, out, "fresh, both parts in one call");
  EXPECT_THROW(native_weight_grad(dw.data_ptr<float>(), nullptr, 0, out, {}, false, &sq), BatchError);
}

const Shape kShapes[] = {Shape{32, 1024, 1024}, Shape{1, 1, 1},   Shape{7, 33, 17},  Shape{8, 32, 8},
                         Shape{33, 64, 40},     Shape{70, 100, 31}, Shape{9, 16, 65}, Shape{0, 8, 8},
                         Shape{33, 40, 300},    Shape{13, 24, 13}};

INSTANTIATE_TEST_SUITE_P(Shapes, SmallGemmTest, ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kShapes)),
                         [](const auto& info) {
                           const Shape& shape = std::get<1>(info.param);
                           return to_string(std::get<0>(info.param)) + "_m" + std::to_string(std::get<0>(shape)) + "_in" +
                                  std::to_string(std::get<1>(shape)) + "_out" + std::to_string(std::get<2>(shape));
                         });

// Every element is the same chain of fused multiply-adds on either instruction set, so AVX2 and
// AVX-512 agree to the bit: a wrong lane, mask or tile edge in one of them shows here even
// where it stays within the float64 tolerance.
TEST(SmallGemm, Avx2AndAvx512GiveTheSameBits) {
  if (!cpu_has(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU lacks avx512: nothing to compare AVX2 with";
  for (const auto& [m, in, out] : kShapes) {
    SCOPED_TRACE("m " + std::to_string(m) + ", in " + std::to_string(in) + ", out " + std::to_string(out));
    torch::manual_seed(m + in + out);
    const auto x = torch::randn({m, in}), w = torch::randn({out, in}), b = torch::randn({out});
    const auto dy = torch::randn({m, out});
    const auto start = torch::randn({out, in});
    const WeightGradOperands part(dy, x);
    std::vector<torch::Tensor> results[2];
    for (int i = 0; i < 2; ++i) {
      ScopedGemmIsa isa(kIsas[i]);
      auto dw = start.clone();
      auto db = torch::zeros({out});
      native_weight_grad(dw.data_ptr<float>(), db.data_ptr<float>(), 0, out, {&part, &part}, false);
      results[i] = {native_linear(x, w, b), native_input_grad(dy, PackedWeight(w)), dw, db};
    }
    const char* what[] = {"forward", "input grad", "weight grad", "bias grad"};
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::equal(results[0][r], results[1][r])) << what[r];
  }
}

// The instruction sets this CPU has, each forced in turn (the loop body runs under it).
template <typename F>
void for_each_isa(F&& f) {
  for (const GemmIsa isa : kIsas) {
    if (!cpu_has(isa)) continue;
    SCOPED_TRACE(to_string(isa));
    ScopedGemmIsa scope(isa);
    f();
  }
}

TEST(SmallGemm, StridedInputsAndThreads) {
  if (!native_gemm_available()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 and FMA";
  const auto x = torch::randn({64, 48}).t();  // 48 x 64, not contiguous
  const auto w = torch::randn({96, 64});
  const auto b = torch::randn({96});
  const auto dy = torch::randn({96, 48}).t();  // 48 x 96
  const int saved = at::get_num_threads();
  for_each_isa([&] {
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      EXPECT_TRUE(linear_close(native_linear(x, w, b), x, w, b)) << "strided x, threads " << threads;
      EXPECT_TRUE(matmul_close(native_input_grad(dy, PackedWeight(w)), dy, w)) << "strided dy, threads " << threads;
    }
  });
  at::set_num_threads(saved);
}

// A bias that is a strided view: its contiguous copy must live as long as the kernel reads it.
TEST(SmallGemm, NonContiguousBias) {
  if (!native_gemm_available()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 and FMA";
  const auto x = torch::randn({5, 24});
  const auto w = torch::randn({40, 24});
  const auto every_other = torch::randn({80}).slice(0, 0, 80, 2);
  ASSERT_FALSE(every_other.is_contiguous());
  for_each_isa([&] {
    for (int k = 0; k < 3; ++k) {
      torch::randn({4096});  // churn the allocator: a freed copy would be overwritten
      EXPECT_TRUE(linear_close(native_linear(x, w, every_other), x, w, every_other));
    }
  });
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
  if (!native_gemm_available()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 and FMA";
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

// Where the kernels are off (simulated: switched off, or no instruction set) every entry is a
// ConfigError naming the fix and why they are off, never an illegal instruction.
TEST(SmallGemm, WithoutKernelsEveryEntryRefusesByName) {
  const auto x = torch::randn({3, 6}), w = torch::randn({8, 6});
  const WeightGradOperands a(torch::randn({3, 8}), x);
  auto dw = torch::zeros({8, 6});
  auto errors = [&] {
    const bool available = native_gemm_available();
    EXPECT_FALSE(available);
    return std::vector<std::pair<std::string, std::string>>{
        {"native_linear", error_of([&] { native_linear(x, w, torch::Tensor()); })},
        {"native_input_grad", error_of([&] { native_input_grad(torch::randn({3, 8}), PackedWeight(w)); })},
        {"native_weight_grad",
         error_of([&] { native_weight_grad(dw.data_ptr<float>(), nullptr, 0, 8, {&a}, false); })}};
  };
  disable_native_gemm(true);
  const auto disabled = errors();
  disable_native_gemm(false);
  std::vector<std::pair<std::string, std::string>> none;
  {
    ScopedGemmIsa scope(GemmIsa::None);
    none = errors();
  }
  for (const auto& [who, what] : disabled) {
    EXPECT_NE(what.find(who), std::string::npos) << what;
    EXPECT_NE(what.find("AVX-512F"), std::string::npos) << what;
    EXPECT_NE(what.find("AVX2"), std::string::npos) << what;
    EXPECT_NE(what.find("disable_native_gemm"), std::string::npos) << what;
    EXPECT_NE(what.find("auto"), std::string::npos) << what;
  }
  for (const auto& [who, what] : none) {
    EXPECT_NE(what.find(who), std::string::npos) << what;
    EXPECT_NE(what.find("none (set_native_gemm_isa"), std::string::npos) << what;
  }
}

// The instruction set in use is what was forced, and says so; names parse both ways.
TEST(SmallGemm, ForcedIsaIsReported) {
  for (const GemmIsa isa : {GemmIsa::None, GemmIsa::Avx2, GemmIsa::Avx512}) {
    EXPECT_EQ(parse_gemm_isa(to_string(isa)), isa);
    if (!cpu_has(isa)) {
      // Never run an instruction set the CPU lacks: that would be a SIGILL, not an error.
      try {
        set_native_gemm_isa(isa);
        ADD_FAILURE() << "forcing " << to_string(isa) << " on a CPU without it";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(to_string(cpu_gemm_isa())), std::string::npos) << e.what();
      }
      continue;
    }
    ScopedGemmIsa scope(isa);
    EXPECT_EQ(native_gemm_isa(), isa);
    EXPECT_EQ(native_gemm_available(), isa != GemmIsa::None);
    const std::string summary = native_gemm_summary();
    EXPECT_EQ(summary.rfind(to_string(isa) + " (set_native_gemm_isa; this CPU has " + to_string(cpu_gemm_isa()), 0),
              0u)
        << summary;
  }
  EXPECT_EQ(parse_gemm_isa("auto"), cpu_gemm_isa());
  const std::string bad = error_of([] { parse_gemm_isa("sse4"); });
  EXPECT_NE(bad.find("\"sse4\""), std::string::npos) << bad;
  EXPECT_NE(bad.find("avx2"), std::string::npos) << bad;
}

// PIPETRAIN_GEMM_ISA is read at the first call, so each case runs in a fresh process (the
// "threadsafe" death-test style re-executes this binary) that sets it, reports on stderr and
// exits 0 where all is as expected.
void report_isa_from_environment(const char* value) {
  setenv("PIPETRAIN_GEMM_ISA", value, 1);
  try {
    std::cerr << "isa " << native_gemm_summary() << "\n";
    bool ok = native_gemm_available() == (native_gemm_isa() != GemmIsa::None);
    if (native_gemm_available()) {  // the kernels run on it, not just the report
      const auto x = torch::randn({5, 24}), w = torch::randn({40, 24});
      ok = ok && linear_close(native_linear(x, w, torch::Tensor()), x, w, torch::Tensor());
    }
    std::exit(ok ? 0 : 1);
  } catch (const ConfigError& e) {
    std::cerr << "error " << e.what() << "\n";
    std::exit(0);
  }
}

TEST(SmallGemmDeathTest, EnvironmentChoosesTheIsa) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  if (cpu_has(GemmIsa::Avx2)) {
    EXPECT_EXIT(report_isa_from_environment("avx2"), ::testing::ExitedWithCode(0),
                "isa avx2 \\(PIPETRAIN_GEMM_ISA; this CPU has avx");
  }
  EXPECT_EXIT(report_isa_from_environment("none"), ::testing::ExitedWithCode(0), "isa none \\(PIPETRAIN_GEMM_ISA");
  EXPECT_EXIT(report_isa_from_environment("avx1024"), ::testing::ExitedWithCode(0),
              "error PIPETRAIN_GEMM_ISA=avx1024: unknown instruction set \"avx1024\"");
  if (!cpu_has(GemmIsa::Avx512)) {
    EXPECT_EXIT(report_isa_from_environment("avx512"), ::testing::ExitedWithCode(0),
                "error PIPETRAIN_GEMM_ISA=avx512: the avx512 kernels need AVX-512F, which this CPU lacks");
  }
}

}  // namespace
}  // namespace pipetrain::runtime
