// Generating, validating and simulating large schedules (256 stages x 1024 micro-batches).
//
// The baseline in the same run is generation alone; validation and simulation are quoted as
// ratios to it. Run: build/bench/schedule_bench --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace {

using pipetrain::schedule::CostModel;
using pipetrain::schedule::generate;
using pipetrain::schedule::ScheduleKind;
using pipetrain::schedule::ScheduleOptions;

ScheduleOptions options(const benchmark::State& state, ScheduleKind kind) {
  return ScheduleOptions(kind, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
}

void BM_Generate1F1B(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(generate(options(state, ScheduleKind::one_f_one_b)));
}

void BM_GenerateAndValidate1F1B(benchmark::State& state) {
  for (auto _ : state) {
    auto s = generate(options(state, ScheduleKind::one_f_one_b));
    pipetrain::schedule::validate(s);
    benchmark::DoNotOptimize(s);
  }
  const auto s = generate(options(state, ScheduleKind::one_f_one_b));
  state.counters["actions"] = static_cast<double>(s.num_actions());
}

void BM_Validate1F1B(benchmark::State& state) {
  const auto s = generate(options(state, ScheduleKind::one_f_one_b));
  for (auto _ : state) pipetrain::schedule::validate(s);
}

void BM_Simulate1F1B(benchmark::State& state) {
  const auto s = generate(options(state, ScheduleKind::one_f_one_b));
  const auto costs = CostModel::uniform(s.num_stages(), 1, 1, 1, 0.1);
  for (auto _ : state) benchmark::DoNotOptimize(pipetrain::schedule::simulate(s, costs));
}

void BM_GenerateAndValidateZbV(benchmark::State& state) {
  for (auto _ : state) {
    auto s = generate(options(state, ScheduleKind::zb_v));
    pipetrain::schedule::validate(s);
    benchmark::DoNotOptimize(s);
  }
}

}  // namespace

BENCHMARK(BM_Generate1F1B)->Args({256, 1024})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GenerateAndValidate1F1B)
    ->Args({256, 1024})
    ->Args({16, 64})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Validate1F1B)->Args({256, 1024})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Simulate1F1B)->Args({256, 1024})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GenerateAndValidateZbV)->Args({256, 1024})->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
