// The engine's Linear products on the shapes of workload "mlp" (shared/bench/WORKLOADS.md),
// one thread: native kernels (runtime/small_gemm.h), on AVX-512 and on AVX2 (forced with
// set_native_gemm_isa, so both are measured on one AVX-512 machine), against LibTorch's BLAS
// on the same shapes.
// "layers" is how many distinct 1024x1024 weights the loop cycles through: 1 keeps the weight
// in cache, 8 is a stage of "mlp" (32 MiB of weights, more than this machine's L2 and its
// share of L3), which is what a pipeline stage really streams.
//
// Beside them, the candidates for other kernels (issue 17), each checked once against the
// float64 product before it is timed (gemm_check.h; a wrong one is skipped with an error):
//   NativeBf16* pipetrain's AVX512_BF16 kernels (runtime/small_gemm_bf16.h), what the engine runs
//   TorchBf16*  torch::mm on bfloat16 tensors (oneDNN's bf16 GEMM where the CPU has AVX512_BF16)
//   Xsmm*       libxsmm's JIT kernels, fp32 and bf16 (only when built with libxsmm: xsmm_gemm.h)
// For forward and input gradient, "prep" = 1 times the per-step preparation of the fp32 weight
// too (cast to bf16, libxsmm's layouts); prep = 0 is the steady state, prepared once per step.
// Activations (x, dy) are given in the candidate's precision; laying them out is timed.
//
// Run: build/bench/small_gemm_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
//      LIBXSMM_TARGET=hsw build/bench/small_gemm_bench --benchmark_filter=Xsmm  # libxsmm's AVX2 code
//      OPENBLAS_CORETYPE=Haswell build/bench/small_gemm_bench --benchmark_filter=Blas  # OpenBLAS's AVX2 code
#include <benchmark/benchmark.h>

#include <ATen/Parallel.h>

#include <string>

#include "gemm_check.h"
#include "pipetrain/runtime/small_gemm.h"
#include "pipetrain/runtime/small_gemm_bf16.h"
#ifdef PIPETRAIN_WITH_LIBXSMM
#include "xsmm_gemm.h"
#endif

namespace {

using pipetrain::runtime::GemmIsa;
using pipetrain::runtime::PackedWeight;

constexpr int64_t kFeatures = 1024;

struct Layers {
  std::vector<torch::Tensor> weights, biases;
  std::vector<PackedWeight> packed;
  explicit Layers(int64_t n) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < n; ++i) {
      weights.push_back(torch::randn({kFeatures, kFeatures}) / 32);
      biases.push_back(torch::randn({kFeatures}) / 32);
      packed.emplace_back(weights.back());
    }
  }
};

void report(benchmark::State& state, int64_t rows) {
  const double flops = 2.0 * static_cast<double>(rows) * kFeatures * kFeatures;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

// Runs the native kernels on `isa`, or skips where this CPU lacks it.
bool skip_without_kernels(benchmark::State& state, GemmIsa isa) {
  if (static_cast<int>(isa) <= static_cast<int>(pipetrain::runtime::cpu_gemm_isa())) {
    pipetrain::runtime::set_native_gemm_isa(isa);
    return false;
  }
  state.SkipWithError(("no " + pipetrain::runtime::to_string(isa) + " on this CPU: those kernels are not used here").c_str());
  return true;
}

void BM_NativeForward(benchmark::State& state, GemmIsa isa) {
  if (skip_without_kernels(state, isa)) return;
  at::set_num_threads(1);
  const int64_t rows = state.range(0);
  Layers l(state.range(1));
  auto x = torch::randn({rows, kFeatures});
  size_t i = 0;
  for (auto _ : state) {
    auto y = pipetrain::runtime::native_linear(x, l.weights[i], l.biases[i]);
    benchmark::DoNotOptimize(y.data_ptr<float>());
    i = (i + 1) % l.weights.size();
  }
  report(state, rows);
}

void BM_BlasForward(benchmark::State& state) {
  at::set_num_threads(1);
  const int64_t rows = state.range(0);
  Layers l(state.range(1));
  auto x = torch::randn({rows, kFeatures});
  size_t i = 0;
  for (auto _ : state) {
    auto y = torch::addmm(l.biases[i], x, l.weights[i].t());
    benchmark::DoNotOptimize(y.data_ptr<float>());
    i = (i + 1) % l.weights.size();
  }
  report(state, rows);
}

void BM_NativeInputGrad(benchmark::State& state, GemmIsa isa) {
  if (skip_without_kernels(state, isa)) return;
  at::set_num_threads(1);
  const int64_t rows = state.range(0);
  Layers l(state.range(1));
  auto dy = torch::randn({rows, kFeatures});
  size_t i = 0;
  for (auto _ : state) {
    auto dx = pipetrain::runtime::native_input_grad(dy, l.packed[i]);
    benchmark::DoNotOptimize(dx.data_ptr<float>());
    i = (i + 1) % l.packed.size();
  }
  report(state, rows);
}

void BM_BlasInputGrad(benchmark::State& state) {
  at::set_num_threads(1);
  const int64_t rows = state.range(0);
  Layers l(state.range(1));
  auto dy = torch::randn({rows, kFeatures});
  size_t i = 0;
  for (auto _ : state) {
    auto dx = torch::mm(dy, l.weights[i]);
    benchmark::DoNotOptimize(dx.data_ptr<float>());
    i = (i + 1) % l.weights.size();
  }
  report(state, rows);
}

// dW = dy^T x over `rows` rows (micro-batches of 32 rows, all of a fused group), read in place
// into one accumulator, as DeferredLinear runs it; state.range(1) row blocks per call.
void BM_NativeWeightGrad(benchmark::State& state, GemmIsa isa) {
  if (skip_without_kernels(state, isa)) return;
  at::set_num_threads(1);
  const int64_t rows = state.range(0), blocks = state.range(1);
  auto x = torch::randn({rows, kFeatures});
  auto dy = torch::randn({rows, kFeatures});
  auto dw = torch::zeros({kFeatures, kFeatures});
  auto db = torch::zeros({kFeatures});
  for (auto _ : state) {
    // Packing is part of the cost: each micro-batch's operands are laid out once.
    std::vector<pipetrain::runtime::WeightGradOperands> ops;
    for (int64_t r = 0; r < rows; r += 32) ops.emplace_back(dy.slice(0, r, r + 32), x.slice(0, r, r + 32));
    std::vector<const pipetrain::runtime::WeightGradOperands*> parts;
    for (const auto& op : ops) parts.push_back(&op);
    const int64_t step = kFeatures / blocks;
    for (int64_t r = 0; r < kFeatures; r += step) {
      pipetrain::runtime::native_weight_grad(dw.data_ptr<float>(), db.data_ptr<float>(), r, r + step, parts, true);
    }
    benchmark::DoNotOptimize(dw.data_ptr<float>());
  }
  report(state, rows);
}

void BM_BlasWeightGrad(benchmark::State& state) {
  at::set_num_threads(1);
  const int64_t rows = state.range(0);
  auto x = torch::randn({rows, kFeatures});
  auto dy = torch::randn({rows, kFeatures});
  for (auto _ : state) {
    auto dw = torch::mm(dy.t(), x);
    benchmark::DoNotOptimize(dw.data_ptr<float>());
  }
  report(state, rows);
}

enum class Product { kForward, kInputGrad, kWeightGrad };

constexpr double kBf16Eps = 1.0 / 128;  // torch::finfo(bfloat16).eps: 8 significant bits

bool skip_if_wrong(benchmark::State& state, const std::string& mismatch) {
  if (mismatch.empty()) return false;
  state.SkipWithError(mismatch.c_str());
  return true;
}

// torch::mm on bfloat16: forward x W^T and input gradient dy W over `layers` weights, or the
// weight gradient dy^T x; prep = 1 casts the fp32 weight into a reused bf16 buffer every call.
void BM_TorchBf16(benchmark::State& state, Product product) {
  at::set_num_threads(1);
  const int64_t rows = state.range(0);
  const bool prep = state.range(2) != 0;
  auto act = torch::randn({rows, kFeatures}).to(torch::kBFloat16);  // x, or dy
  if (product == Product::kWeightGrad) {
    auto x = torch::randn({rows, kFeatures}).to(torch::kBFloat16);
    if (skip_if_wrong(state, pipetrain::bench::gemm_mismatch(torch::mm(act.t(), x), act.t(), x, kBf16Eps))) return;
    for (auto _ : state) {
      auto dw = torch::mm(act.t(), x);
      benchmark::DoNotOptimize(dw.data_ptr());
    }
    report(state, rows);
    return;
  }
  Layers l(state.range(1));
  std::vector<torch::Tensor> cast;
  for (const auto& w : l.weights) cast.push_back(w.to(torch::kBFloat16));
  auto buffer = torch::empty_like(cast[0]);
  const auto run = [&](const torch::Tensor& w) { return product == Product::kForward ? torch::mm(act, w.t()) : torch::mm(act, w); };
  const auto rhs = product == Product::kForward ? cast[0].t() : cast[0];
  if (skip_if_wrong(state, pipetrain::bench::gemm_mismatch(run(cast[0]), act, rhs, kBf16Eps))) return;
  size_t i = 0;
  for (auto _ : state) {
    if (prep) buffer.copy_(l.weights[i]);
    auto y = run(prep ? buffer : cast[i]);
    benchmark::DoNotOptimize(y.data_ptr());
    i = (i + 1) % l.weights.size();
  }
  report(state, rows);
}

#ifdef PIPETRAIN_WITH_LIBXSMM
using pipetrain::bench::XsmmBf16;
using pipetrain::bench::XsmmF32;

// libxsmm fp32, out = L R row-major (xsmm_gemm.h): forward R = W^T (prep = 1 transposes the
// weight into a reused buffer every call), input gradient R = W, weight gradient L = dy^T read
// through TRANS_B. The label names the code path (cpx/skx: AVX-512, hsw: AVX2).
void BM_XsmmF32(benchmark::State& state, Product product) {
  at::set_num_threads(1);
  state.SetLabel(pipetrain::bench::xsmm_target());
  const int64_t rows = state.range(0);
  const bool prep = state.range(2) != 0;
  auto act = torch::randn({rows, kFeatures});
  if (product == Product::kWeightGrad) {
    auto x = torch::randn({rows, kFeatures});
    auto dw = torch::empty({kFeatures, kFeatures});
    const XsmmF32 kernel(kFeatures, rows, kFeatures, /*l_transposed=*/true);
    if (!kernel.ok()) return state.SkipWithError("libxsmm has no fp32 kernel for dy^T x");
    kernel(act.data_ptr<float>(), x.data_ptr<float>(), dw.data_ptr<float>());
    if (skip_if_wrong(state, pipetrain::bench::gemm_mismatch(dw, act.t(), x))) return;
    for (auto _ : state) {
      kernel(act.data_ptr<float>(), x.data_ptr<float>(), dw.data_ptr<float>());
      benchmark::DoNotOptimize(dw.data_ptr<float>());
    }
    report(state, rows);
    return;
  }
  Layers l(state.range(1));
  const bool forward = product == Product::kForward;
  std::vector<torch::Tensor> r;  // R per layer, prepared once
  for (const auto& w : l.weights) r.push_back(forward ? w.t().contiguous() : w);
  torch::Tensor buffer;
  auto out = torch::empty({rows, kFeatures});
  const XsmmF32 kernel(rows, kFeatures, kFeatures, false);
  if (!kernel.ok()) return state.SkipWithError("libxsmm has no fp32 kernel for this shape");
  kernel(act.data_ptr<float>(), r[0].data_ptr<float>(), out.data_ptr<float>());
  if (skip_if_wrong(state, pipetrain::bench::gemm_mismatch(out, act, r[0]))) return;
  size_t i = 0;
  for (auto _ : state) {
    if (prep && forward) pipetrain::bench::lay_out<float>(l.weights[i].t(), buffer, false);
    kernel(act.data_ptr<float>(), (prep && forward ? buffer : r[i]).data_ptr<float>(), out.data_ptr<float>());
    benchmark::DoNotOptimize(out.data_ptr<float>());
    i = (i + 1) % l.weights.size();
  }
  report(state, rows);
}

// libxsmm bf16 in, fp32 out: R in VNNI pairs (prep = 1 casts and lays out the fp32 weight
// every call); the weight gradient lays out its activations (x in pairs, dy^T) every call.
void BM_XsmmBf16(benchmark::State& state, Product product) {
  at::set_num_threads(1);
  state.SetLabel(pipetrain::bench::xsmm_target());
  const int64_t rows = state.range(0);
  const bool prep = state.range(2) != 0;
  auto act = torch::randn({rows, kFeatures}).to(torch::kBFloat16);
  if (product == Product::kWeightGrad) {
    auto x = torch::randn({rows, kFeatures}).to(torch::kBFloat16);
    auto dw = torch::empty({kFeatures, kFeatures});
    torch::Tensor dy_t, x_pairs;
    const XsmmBf16 kernel(kFeatures, rows, kFeatures);
    if (!kernel.ok()) return state.SkipWithError("libxsmm has no bf16 kernel for this target");
    const auto run = [&] {
      pipetrain::bench::lay_out<at::BFloat16>(act.t(), dy_t, false);
      pipetrain::bench::lay_out<at::BFloat16>(x, x_pairs, true);
      kernel(dy_t.data_ptr<at::BFloat16>(), x_pairs.data_ptr<at::BFloat16>(), dw.data_ptr<float>());
    };
    run();
    if (skip_if_wrong(state, pipetrain::bench::gemm_mismatch(dw, act.t(), x))) return;
    for (auto _ : state) {
      run();
      benchmark::DoNotOptimize(dw.data_ptr<float>());
    }
    report(state, rows);
    return;
  }
  Layers l(state.range(1));
  const bool forward = product == Product::kForward;
  const auto rhs = [&](const torch::Tensor& w) { return forward ? w.t() : w; };
  std::vector<torch::Tensor> pairs(l.weights.size());
  for (size_t i = 0; i < pairs.size(); ++i) pipetrain::bench::lay_out<at::BFloat16>(rhs(l.weights[i]), pairs[i], true);
  torch::Tensor buffer;
  auto out = torch::empty({rows, kFeatures});
  const XsmmBf16 kernel(rows, kFeatures, kFeatures);
  if (!kernel.ok()) return state.SkipWithError("libxsmm has no bf16 kernel for this target");
  kernel(act.data_ptr<at::BFloat16>(), pairs[0].data_ptr<at::BFloat16>(), out.data_ptr<float>());
  const auto r0 = rhs(l.weights[0]).to(torch::kBFloat16);
  if (skip_if_wrong(state, pipetrain::bench::gemm_mismatch(out, act, r0))) return;
  size_t i = 0;
  for (auto _ : state) {
    if (prep) pipetrain::bench::lay_out<at::BFloat16>(rhs(l.weights[i]), buffer, true);
    kernel(act.data_ptr<at::BFloat16>(), (prep ? buffer : pairs[i]).data_ptr<at::BFloat16>(), out.data_ptr<float>());
    benchmark::DoNotOptimize(out.data_ptr<float>());
    i = (i + 1) % l.weights.size();
  }
  report(state, rows);
}
#endif  // PIPETRAIN_WITH_LIBXSMM

// The engine's bf16 products: forward and input gradient over `layers` bf16 weights (prep = 1
// casts and packs the fp32 weight every call, as once per step), or the weight gradient into
// float32 over 32-row micro-batches, packing included.
void BM_NativeBf16(benchmark::State& state, Product product) {
  namespace rt = pipetrain::runtime;
  if (!rt::native_bf16_available()) return state.SkipWithError("no AVX512_BF16 kernels here");
  at::set_num_threads(1);
  const int64_t rows = state.range(0);
  const bool prep = state.range(2) != 0;
  Layers l(state.range(1));
  auto act = torch::randn({rows, kFeatures}).to(torch::kBFloat16);  // x, or dy
  if (product == Product::kWeightGrad) {
    auto x = torch::randn({rows, kFeatures}).to(torch::kBFloat16);
    // One gradient per layer: a stage's 8 are 32 MiB, which stream from memory.
    std::vector<torch::Tensor> dws;
    for (int64_t j = 0; j < state.range(1); ++j) dws.push_back(torch::zeros({kFeatures, kFeatures}));
    size_t i = 0;
    for (auto _ : state) {
      std::vector<rt::WeightGradPairs> ops;
      for (int64_t r = 0; r < rows; r += 32) ops.emplace_back(act.slice(0, r, r + 32), x.slice(0, r, r + 32));
      std::vector<const rt::WeightGradPairs*> parts;
      for (const auto& op : ops) parts.push_back(&op);
      rt::native_weight_grad_bf16(dws[i].data_ptr<float>(), nullptr, 0, kFeatures, parts, true);
      benchmark::DoNotOptimize(dws[i].data_ptr<float>());
      i = (i + 1) % dws.size();
    }
    return report(state, rows);
  }
  std::vector<torch::Tensor> cast;
  std::vector<rt::PackedPairs> packed(l.weights.size());
  for (size_t i = 0; i < l.weights.size(); ++i) {
    cast.push_back(l.weights[i].to(torch::kBFloat16));
    packed[i].pack(cast.back());
  }
  size_t i = 0;
  for (auto _ : state) {
    if (prep) {
      cast[i] = l.weights[i].to(torch::kBFloat16);
      if (product == Product::kInputGrad) packed[i].pack(cast[i]);
    }
    auto out = product == Product::kForward ? rt::native_linear_bf16(act, cast[i], l.biases[i])
                                            : rt::native_input_grad_bf16(act, packed[i]);
    benchmark::DoNotOptimize(out.data_ptr());
    i = (i + 1) % l.weights.size();
  }
  report(state, rows);
}

// rows x layers x prep for the candidates' forward and input gradient.
void candidate_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "layers", "prep"});
  for (int64_t rows : {32, 256}) {
    for (int64_t layers : {1, 8}) {
      for (int64_t prep : {0, 1}) b->Args({rows, layers, prep});
    }
  }
  b->Unit(benchmark::kMicrosecond);
}

#ifdef PIPETRAIN_WITH_LIBXSMM
// Where nothing is prepared per step (libxsmm fp32 reads W as it is for dx = dy W).
void candidate_steady_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "layers", "prep"});
  for (int64_t rows : {32, 256}) {
    for (int64_t layers : {1, 8}) b->Args({rows, layers, 0});
  }
  b->Unit(benchmark::kMicrosecond);
}
#endif

void candidate_weight_grad_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "layers", "prep"})->Args({32, 1, 0})->Args({256, 1, 0})->Unit(benchmark::kMicrosecond);
}

void layer_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "layers"});
  for (int64_t rows : {32, 256}) {
    for (int64_t layers : {1, 8}) b->Args({rows, layers});
  }
  b->Unit(benchmark::kMicrosecond);
}

void weight_grad_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "blocks"})->Args({32, 1})->Args({192, 1})->Args({256, 1})->Args({256, 16});
  b->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK_CAPTURE(BM_NativeForward, avx512, GemmIsa::Avx512)->Apply(layer_shapes);
BENCHMARK_CAPTURE(BM_NativeForward, avx2, GemmIsa::Avx2)->Apply(layer_shapes);
BENCHMARK(BM_BlasForward)->Apply(layer_shapes);
BENCHMARK_CAPTURE(BM_NativeInputGrad, avx512, GemmIsa::Avx512)->Apply(layer_shapes);
BENCHMARK_CAPTURE(BM_NativeInputGrad, avx2, GemmIsa::Avx2)->Apply(layer_shapes);
BENCHMARK(BM_BlasInputGrad)->Apply(layer_shapes);
BENCHMARK_CAPTURE(BM_NativeWeightGrad, avx512, GemmIsa::Avx512)->Apply(weight_grad_shapes);
BENCHMARK_CAPTURE(BM_NativeWeightGrad, avx2, GemmIsa::Avx2)->Apply(weight_grad_shapes);
BENCHMARK(BM_BlasWeightGrad)->ArgName("rows")->Arg(32)->Arg(192)->Arg(256)->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_NativeBf16, Forward, Product::kForward)->Apply(candidate_shapes);
BENCHMARK_CAPTURE(BM_NativeBf16, InputGrad, Product::kInputGrad)->Apply(candidate_shapes);
BENCHMARK_CAPTURE(BM_NativeBf16, WeightGrad, Product::kWeightGrad)
    ->ArgNames({"rows", "layers", "prep"})
    ->Args({32, 1, 0})
    ->Args({256, 1, 0})
    ->Args({256, 8, 0})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_TorchBf16, Forward, Product::kForward)->Apply(candidate_shapes);
BENCHMARK_CAPTURE(BM_TorchBf16, InputGrad, Product::kInputGrad)->Apply(candidate_shapes);
BENCHMARK_CAPTURE(BM_TorchBf16, WeightGrad, Product::kWeightGrad)->Apply(candidate_weight_grad_shapes);
#ifdef PIPETRAIN_WITH_LIBXSMM
BENCHMARK_CAPTURE(BM_XsmmF32, Forward, Product::kForward)->Apply(candidate_shapes);
BENCHMARK_CAPTURE(BM_XsmmF32, InputGrad, Product::kInputGrad)->Apply(candidate_steady_shapes);
BENCHMARK_CAPTURE(BM_XsmmF32, WeightGrad, Product::kWeightGrad)->Apply(candidate_weight_grad_shapes);
BENCHMARK_CAPTURE(BM_XsmmBf16, Forward, Product::kForward)->Apply(candidate_shapes);
BENCHMARK_CAPTURE(BM_XsmmBf16, InputGrad, Product::kInputGrad)->Apply(candidate_shapes);
BENCHMARK_CAPTURE(BM_XsmmBf16, WeightGrad, Product::kWeightGrad)->Apply(candidate_weight_grad_shapes);
#endif

BENCHMARK_MAIN();
