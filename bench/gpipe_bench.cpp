// GPipe on the standard workload "mlp" (shared/bench/WORKLOADS.md) against the plain model in
// the same run: samples/s, GFLOP/s, the ratio to the plain model, and the bytes of activations
// each checkpoint mode keeps for backward (counted by runtime::AllocationCounter: real storage
// left alive by the forward pass, minus the output).
//
// Run (fresh processes, quote medians):
//   for r in 1 2 3 4 5; do build/bench/gpipe_bench; done
// Threads: the plain model runs with every core and with 1 thread (the single-thread
// baseline); GPipe gives each of its 2 workers cores / 2 OpenMP threads for the pipelined
// forward, and the calling thread, where LibTorch's autograd runs CPU backward, cores / 2 too.
// x_plain is samples/s over the faster of the two plain runs of the same process.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "pipetrain/engine/gpipe.h"
#include "pipetrain/partition/balance.h"
#include "pipetrain/runtime/allocation_counter.h"
#include "pipetrain/util/blas.h"

namespace {

constexpr int kWarmup = 3;
constexpr int kSteps = 20;
constexpr int64_t kRows = 256;
constexpr double kFlopsPerStep = 47.0 * 536870912.0;  // 25.23 GFLOP

struct Workload {
  torch::nn::Sequential model;
  torch::Tensor x, y;
};

// Workload "mlp", exactly in the definition's order; aborts if the check values differ.
Workload make_mlp() {
  torch::manual_seed(0);
  Workload w;
  for (int i = 0; i < 16; ++i) {
    w.model->push_back(torch::nn::Linear(1024, 1024));
    w.model->push_back(torch::nn::ReLU());
  }
  w.x = torch::randn({kRows, 1024});
  w.y = torch::randn({kRows, 1024});
  auto near = [](const torch::Tensor& t, double v) {
    return std::abs(t.sum().item<double>() - v) < 1e-3 * std::max(1.0, std::abs(v));
  };
  auto lin0 = w.model[0]->as<torch::nn::Linear>();
  auto lin30 = w.model[30]->as<torch::nn::Linear>();
  if (!near(lin0->weight, 14.062727) || !near(lin0->bias, -0.772785) ||
      !near(lin30->weight, -7.232272) || !near(w.x, 684.116211) || !near(w.y, -253.066254)) {
    std::fprintf(stderr, "workload mlp: check values differ from WORKLOADS.md\n");
    std::abort();
  }
  return w;
}

template <typename Forward>
void run_steps(benchmark::State& state, torch::nn::Module& params, Forward&& forward,
               const Workload& w) {
  torch::optim::SGD sgd(params.parameters(), torch::optim::SGDOptions(0.01));
  auto step = [&] {
    sgd.zero_grad();
    torch::Tensor loss = torch::mse_loss(forward(w.x), w.y);
    loss.backward();
    sgd.step();
    return loss;
  };
  const double first_loss = step().template item<double>();
  if (std::abs(first_loss - 0.99567413) > 1e-5) {
    state.SkipWithError("first-step loss differs from WORKLOADS.md (0.99567413)");
    return;
  }
  for (int k = 1; k < kWarmup; ++k) step();
  for (auto _ : state) step();
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(kRows), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(kFlopsPerStep / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Bytes the forward leaves alive for backward: live storage after forward, minus the output.
template <typename Forward>
double saved_bytes(Forward&& forward, const torch::Tensor& x) {
  pipetrain::runtime::AllocationCounter counter;
  torch::Tensor out = forward(x);
  return static_cast<double>(counter.live_bytes() - static_cast<int64_t>(out.nbytes()));
}

// The last timed step's bubble, measured and simulated (GPipeImpl::last_step_bubble).
void report_bubble(benchmark::State& state, const pipetrain::GPipeImpl& gpipe) {
  const auto bubble = gpipe.last_step_bubble();
  state.counters["bubble"] = bubble.measured;
  state.counters["bubble_sim"] = bubble.simulated;
}

void BM_Plain(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  at::set_num_threads(threads);
  Workload w = make_mlp();
  auto forward = [&](const torch::Tensor& x) { return w.model->forward(x); };
  run_steps(state, *w.model, forward, w);
  state.counters["saved_MiB"] = saved_bytes(forward, w.x) / (1 << 20);
  state.counters["threads"] = threads;
}

// GPipe over `balance` with range(0) as its checkpoint mode; each worker and the caller get
// cores / partitions OpenMP threads. Reports the last step's bubble.
void run_gpipe(benchmark::State& state, std::vector<int64_t> balance, const std::string& label, bool saved) {
  const auto mode = static_cast<pipetrain::Checkpoint>(state.range(0));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = std::max(1, cores / static_cast<int>(balance.size()));
  at::set_num_threads(threads);
  Workload w = make_mlp();
  pipetrain::GPipe gpipe(w.model, pipetrain::GPipeOptions(std::move(balance))
                                      .chunks(8)
                                      .checkpoint(mode)
                                      .intra_op_threads(threads));
  auto forward = [&](const torch::Tensor& x) { return gpipe->forward(x); };
  run_steps(state, *gpipe, forward, w);
  report_bubble(state, *gpipe);
  if (saved) state.counters["saved_MiB"] = saved_bytes(forward, w.x) / (1 << 20);
  state.SetLabel(label + "checkpoint=" + pipetrain::to_string(mode));
}

void BM_GPipe(benchmark::State& state) { run_gpipe(state, {16, 16}, "", /*saved=*/true); }

// Workload "mlp-4": four partitions {8, 8, 8, 8} on the same cores (more partitions than cores:
// what the pipelined backward and the weight-gradient products do when workers share a core).
void BM_GPipe4(benchmark::State& state) { run_gpipe(state, {8, 8, 8, 8}, "mlp-4, ", /*saved=*/false); }

// GPipe (no checkpointing) with the balance [k, 32 - k] for k = range(0), or for k = 0 the
// automatic balance by time (profiled on one 32-row micro-batch, as the pipeline runs it).
void BM_GPipeBalance(benchmark::State& state) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(std::max(1, cores / 2));
  Workload w = make_mlp();
  std::vector<int64_t> balance{state.range(0), 32 - state.range(0)};
  if (state.range(0) == 0) {
    pipetrain::TimeProfileOptions profile;
    profile.budget = std::chrono::milliseconds(1500);
    balance = pipetrain::balance_by_time(2, w.model, pipetrain::Batch(w.x.narrow(0, 0, kRows / 8)), profile);
  }
  pipetrain::GPipe gpipe(w.model, pipetrain::GPipeOptions(balance)
                                      .chunks(8)
                                      .checkpoint(pipetrain::Checkpoint::Never)
                                      .intra_op_threads(std::max(1, cores / 2)));
  auto forward = [&](const torch::Tensor& x) { return gpipe->forward(x); };
  run_steps(state, *gpipe, forward, w);
  state.counters["first_stage_layers"] = static_cast<double>(balance[0]);
  state.SetLabel(state.range(0) == 0 ? "auto" : "hand");
}

// Adds x_plain: samples/s divided by the best plain run's in the same process, and for the
// automatic balance x_best_hand: its samples/s over the best hand balance's (counters arrive
// here already turned into rates).
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> copy = runs;
    for (auto& run : copy) {
      auto it = run.counters.find("samples/s");
      if (it == run.counters.end()) continue;
      if (run.run_name.function_name == "BM_Plain") plain_ = std::max(plain_, it->second.value);
      if (plain_ > 0) run.counters["x_plain"] = benchmark::Counter(it->second.value / plain_);
      if (run.run_name.function_name == "BM_GPipeBalance") {
        if (run.report_label == "hand") best_hand_ = std::max(best_hand_, it->second.value);
        if (run.report_label == "auto" && best_hand_ > 0)
          run.counters["x_best_hand"] = benchmark::Counter(it->second.value / best_hand_);
      }
    }
    ConsoleReporter::ReportRuns(copy);
  }

 private:
  double plain_ = 0;
  double best_hand_ = 0;
};

BENCHMARK(BM_Plain)->Arg(static_cast<int64_t>(std::thread::hardware_concurrency()))->Arg(1)
    ->Iterations(kSteps)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GPipe)
    ->Arg(static_cast<int64_t>(pipetrain::Checkpoint::Never))
    ->Arg(static_cast<int64_t>(pipetrain::Checkpoint::ExceptLast))
    ->Arg(static_cast<int64_t>(pipetrain::Checkpoint::Always))
    ->Iterations(kSteps)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GPipe4)
    ->Arg(static_cast<int64_t>(pipetrain::Checkpoint::Never))
    ->Arg(static_cast<int64_t>(pipetrain::Checkpoint::ExceptLast))
    ->Iterations(kSteps)->Unit(benchmark::kMillisecond)->UseRealTime();
// Hand balances first, the automatic one last (the reporter compares it with the best).
BENCHMARK(BM_GPipeBalance)->Arg(12)->Arg(14)->Arg(16)->Arg(18)->Arg(20)->Arg(0)
    ->Iterations(kSteps)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("blas", pipetrain::util::describe_blas(pipetrain::util::blas_info()));
  benchmark::AddCustomContext("workload", "mlp: 32 layers, balance [16,16], 8 micro-batches");
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
