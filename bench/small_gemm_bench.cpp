// The engine's Linear products on the shapes of workload "mlp" (shared/bench/WORKLOADS.md),
// one thread: native kernels (runtime/small_gemm.h) against LibTorch's BLAS on the same shapes.
// "layers" is how many distinct 1024x1024 weights the loop cycles through: 1 keeps the weight
// in cache, 8 is a stage of "mlp" (32 MiB of weights, more than this machine's L2 and its
// share of L3), which is what a pipeline stage really streams.
//
// Run: build/bench/small_gemm_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <ATen/Parallel.h>

#include "pipetrain/runtime/small_gemm.h"

namespace {

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

bool skip_without_kernels(benchmark::State& state) {
  if (pipetrain::runtime::native_gemm_available()) return false;
  state.SkipWithError("no AVX-512 on this CPU: the native kernels are not used here");
  return true;
}

void BM_NativeForward(benchmark::State& state) {
  if (skip_without_kernels(state)) return;
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

void BM_NativeInputGrad(benchmark::State& state) {
  if (skip_without_kernels(state)) return;
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
void BM_NativeWeightGrad(benchmark::State& state) {
  if (skip_without_kernels(state)) return;
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

void layer_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "layers"});
  for (int64_t rows : {32, 256}) {
    for (int64_t layers : {1, 8}) b->Args({rows, layers});
  }
  b->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_NativeForward)->Apply(layer_shapes);
BENCHMARK(BM_BlasForward)->Apply(layer_shapes);
BENCHMARK(BM_NativeInputGrad)->Apply(layer_shapes);
BENCHMARK(BM_BlasInputGrad)->Apply(layer_shapes);
BENCHMARK(BM_NativeWeightGrad)
    ->ArgNames({"rows", "blocks"})
    ->Args({32, 1})
    ->Args({192, 1})
    ->Args({256, 1})
    ->Args({256, 16})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BlasWeightGrad)->ArgName("rows")->Arg(32)->Arg(192)->Arg(256)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
