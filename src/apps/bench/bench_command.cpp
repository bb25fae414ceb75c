// `pipetrain bench`: a standard workload through the engine (ranks spawned here) and, in the
// same invocation, the plain one-process loop on one thread, reported side by side.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/bench/bench_subject.h"
#include "apps/bench/mlp_workload.h"
#include "apps/examples/example.h"
#include "apps/plan/plan_file.h"
#include "apps/commands.h"
#include "pipetrain/comm/launcher.h"
#include "pipetrain/comm/rank_info.h"
#include "pipetrain/comm/topology.h"
#include "pipetrain/comm/threads.h"
#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/error.h"
#include "pipetrain/runtime/allocation_counter.h"
#include "pipetrain/runtime/small_gemm.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/trace.h"
#include "pipetrain/util/blas.h"

namespace pipetrain::apps {

namespace {

using json = nlohmann::json;

struct BenchArgs {
  std::string workload;  // "": mlp, unless --example or --plan names the subject
  std::string example;
  std::string plan;  // a plan file (pipetrain plan): its layout, balance and checkpointing
  int stages = 0;  // 0: the workload's
  int replicas = 1;
  std::string schedule = "1f1b";
  int chunks = 0;
  int micro_batches = 0;  // 0: the workload's
  int steps = 20;
  int warmup = 3;
  int repeat = 1;
  int threads_per_rank = 0;
  std::string gemm_kernel = "auto";
  std::string bind_cores = "auto";
  std::string precision = "fp32";  // fp32, bf16 or fp16 (the engine's compute; master weights fp32)
  bool deferred_linear = true;
  bool json_only = false;
  bool skip_baseline = false;
  std::string trace;  // Chrome trace of the last engine step, written by rank 0
  // Internal: this process is one rank, writing its result to `result` (rank 0).
  bool worker = false;
  std::string result;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The plain loop of WORKLOADS.md: whole batch, MSE, SGD, one intra-op thread.
json run_baseline(const BenchArgs& args) {
  const int saved_threads = at::get_num_threads();
  comm::apply_threads(1);
  auto workload = make_mlp_workload(args.workload);
  auto model = mlp_sequential(workload);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(MlpWorkload::kLr));
  std::vector<double> losses;
  auto step = [&] {
    sgd.zero_grad();
    auto loss = torch::mse_loss(model->forward(workload.x), workload.y);
    loss.backward();
    sgd.step();
    losses.push_back(loss.item<double>());
  };
  for (int i = 0; i < args.warmup; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < args.steps; ++i) step();
  const double elapsed = seconds_since(t0);
  comm::apply_threads(saved_threads);
  return {{"samples_per_s", args.steps * MlpWorkload::kRows / elapsed},
          {"gflops", MlpWorkload::kFlopsPerStep * args.steps / elapsed / 1e9},
          {"loss_first", losses.front()},
          {"loss_last", losses.back()}};
}

EngineConfig bench_config(const BenchArgs& args, const BenchSubject& subject, int stages) {
  EngineConfig c = subject.config;
  c.pipeline.stages = stages;
  c.pipeline.schedule = args.schedule;
  c.pipeline.chunks = args.chunks;
  c.pipeline.gemm_kernel = args.gemm_kernel;
  c.pipeline.bind_cores = args.bind_cores;
  c.pipeline.deferred_linear = args.deferred_linear;
  c.set_precision(args.precision);
  if (!args.plan.empty()) apply_plan(read_plan_file(args.plan), c);
  return c;
}

// One rank of the engine run (started by run_engine through comm::launch).
int run_worker(const BenchArgs& args) {
  // The replica decides the example's data shard.
  const auto info = comm::rank_info_from_env();
  const int stages = args.stages > 0 ? args.stages : bench_shape(args.workload, args.example).stages;
  const int replica = comm::Topology::for_world(info.world_size, stages).replica_of(info.rank);
  auto subject = bench_subject(args.workload, args.example, args.micro_batches, replica, args.replicas);
  auto config = bench_config(args, subject, stages);
  auto comm = PipelineEngine::connect_from_env(config);
  // Counts what the engine allocates on this thread from here on (its layers, gradients,
  // optimizer state, activations): the measured side of the planner's memory model.
  runtime::AllocationCounter allocations;
  PipelineEngine engine(std::move(subject.module), config, comm);
  std::vector<double> losses;
  int64_t bytes_sent = 0;
  auto step = [&] {
    size_t i = 0;
    FunctionIterator it([&]() -> std::optional<MicroBatch> {
      if (i >= subject.micro_batches.size()) return std::nullopt;
      return subject.micro_batches[i++];
    });
    losses.push_back(engine.train_batch(it));
    bytes_sent = engine.last_step().bytes_sent;
  };
  for (int i = 0; i < args.warmup; ++i) step();
  comm->world().barrier("bench start");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> step_ms;
  std::vector<std::vector<schedule::TimedEvent>> timelines;
  timelines.reserve(static_cast<size_t>(args.steps));
  for (int i = 0; i < args.steps; ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    step();
    step_ms.push_back(seconds_since(s0) * 1e3);
    timelines.push_back(engine.last_events());
  }
  comm->world().barrier("bench end");
  const double elapsed = seconds_since(t0);
  // One step's bubble is one noisy sample on a shared machine: measure every timed step (after
  // the clock stops, as the gathering is collective) and report the medians.
  std::vector<double> measured, simulated, transfer_ms;
  for (const auto& timeline : timelines) {
    const auto b = engine.measure_bubble(timeline);
    measured.push_back(b.measured);
    simulated.push_back(b.simulated);
    transfer_ms.push_back(b.transfer_s * 1e3);
  }
  if (!args.trace.empty()) {
    const auto events = engine.gather_events();
    schedule::TraceOptions trace_options;
    trace_options.microseconds_per_unit = 1e6;
    if (comm->rank() == 0) std::ofstream(args.trace) << schedule::render_chrome_trace(events, trace_options);
  }
  // Every rank's peak, by rank (collective).
  auto peaks = torch::zeros({comm->world_size()}, torch::kDouble);
  peaks[comm->rank()] = static_cast<double>(allocations.peak_bytes()) / (1 << 20);
  std::vector<torch::Tensor> reduce{peaks};
  comm->world().all_reduce(reduce, comm::ReduceOp::Sum, "peak memory");
  if (comm->rank() == 0) {
    const double samples = static_cast<double>(args.steps) * static_cast<double>(subject.rows) * engine.num_replicas();
    json per_stage = json::array();
    for (int j = 0; j < engine.num_stages(); ++j) per_stage.push_back(peaks[engine.topology().rank_of({j, 0})].item<double>());
    json r = {{"samples_per_s", samples / elapsed},
              {"gflops", subject.flops_per_step * args.steps * engine.num_replicas() / elapsed / 1e9},
              {"peak_allocated_mb_per_stage", per_stage},
              {"loss_first", losses.front()},
              {"loss_last", losses.back()},
              {"step_ms", step_ms},
              {"bubble_measured", median(measured)},
              {"bubble_simulated", median(simulated)},
              {"bubble_measured_steps", measured},
              {"bubble_simulated_steps", simulated},
              {"transfer_ms", median(transfer_ms)},
              {"threads_per_rank", at::get_num_threads()},
              {"precision", engine.config().precision()},
              {"rank0_bytes_sent_per_step", bytes_sent},
              {"schedule", schedule::kind_name(engine.train_schedule().kind)},
              {"chunks", engine.train_schedule().num_chunks()}};
    std::ofstream(args.result) << r.dump() << "\n";
  }
  comm->shutdown();
  return 0;
}

std::vector<std::string> worker_command(const BenchArgs& args, const std::string& result) {
  std::vector<std::string> cmd{std::filesystem::read_symlink("/proc/self/exe").string(), "bench", "--worker",
                               "--result", result, "--schedule", args.schedule,
                               "--steps", std::to_string(args.steps), "--warmup", std::to_string(args.warmup),
                               "--gemm-kernel", args.gemm_kernel, "--precision", args.precision,
                               "--bind-cores", args.bind_cores};
  if (!args.workload.empty()) cmd.insert(cmd.end(), {"--workload", args.workload});
  if (!args.example.empty()) cmd.insert(cmd.end(), {"--example", args.example});
  if (!args.plan.empty()) cmd.insert(cmd.end(), {"--plan", std::filesystem::absolute(args.plan).string()});
  cmd.insert(cmd.end(), {"--replicas", std::to_string(args.replicas)});
  if (args.stages > 0) cmd.insert(cmd.end(), {"--stages", std::to_string(args.stages)});
  if (args.chunks > 0) cmd.insert(cmd.end(), {"--chunks", std::to_string(args.chunks)});
  if (args.micro_batches > 0) cmd.insert(cmd.end(), {"--micro-batches", std::to_string(args.micro_batches)});
  if (!args.deferred_linear) cmd.push_back("--no-deferred-linear");
  if (!args.trace.empty()) cmd.insert(cmd.end(), {"--trace", std::filesystem::absolute(args.trace).string()});
  return cmd;
}

json run_engine(const BenchArgs& args, int stages) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("pipetrain-bench-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const auto result = (dir / "result.json").string();
  std::filesystem::remove(result);
  comm::LaunchOptions options;
  options.nproc(stages * args.replicas).threads_per_rank(args.threads_per_rank);
  options.time_limit(std::chrono::milliseconds(600'000));
  const auto launched = comm::launch(worker_command(args, result), options);
  if (launched.exit_code != 0) {
    throw Error("the engine run failed: " + launched.message);
  }
  std::ifstream in(result);
  if (!in) throw Error("the engine run wrote no result to " + result);
  json r = json::parse(in);
  std::filesystem::remove_all(dir);
  return r;
}

// The plan's layout on the arguments (its balance and checkpointing reach the workers
// through the file).
BenchArgs with_plan(BenchArgs args) {
  if (args.plan.empty()) {
    if (args.workload.empty() && args.example.empty()) args.workload = "mlp";
    return args;
  }
  const PlanSpec plan = read_plan_file(args.plan);
  if (args.workload.empty() && args.example.empty()) {
    args.workload = plan.workload;
    args.example = plan.example;
  }
  args.stages = plan.stages;
  args.replicas = plan.replicas;
  args.micro_batches = plan.micro_batches;
  args.schedule = plan.schedule;
  args.chunks = plan.chunks;
  return args;
}

int run_bench(BenchArgs args) {
  args = with_plan(std::move(args));
  if (args.worker) return run_worker(args);
  const auto shape = bench_shape(args.workload, args.example);
  // Only the workloads have the plain loop of WORKLOADS.md to compare with.
  if (!args.example.empty()) args.skip_baseline = true;
  const int stages = args.stages > 0 ? args.stages : shape.stages;
  const int m = args.micro_batches > 0 ? args.micro_batches : shape.micro_batches;
  if (shape.rows % m != 0)
    throw ConfigError(fmt::format("--micro-batches {} does not divide the step's {} rows", m, shape.rows));
  const auto blas = util::blas_info();
  const std::string subject = args.workload.empty() ? "example " + args.example : "workload " + args.workload;
  if (!args.json_only) {
    std::cout << fmt::format("{}: {} stages x {} replicas, {} micro-batches, schedule {}, {} steps after {} warm-up, {} repeat(s)\n",
                             subject, stages, args.replicas, m, args.schedule, args.steps, args.warmup, args.repeat)
              << util::describe_blas(blas) << std::endl;
  }
  std::vector<json> engine_runs, baseline_runs, fp32_runs;
  BenchArgs fp32_args = args;
  fp32_args.precision = "fp32";
  for (int r = 0; r < args.repeat; ++r) {
    engine_runs.push_back(run_engine(args, stages));
    // A low precision is judged against the fp32 engine measured in the same invocation.
    if (args.precision != "fp32") {
      fp32_runs.push_back(run_engine(fp32_args, stages));
      if (!args.json_only) {
        std::cout << fmt::format("  engine   run {}: {:8.1f} samples/s in fp32", r + 1,
                                 fp32_runs.back()["samples_per_s"].get<double>())
                  << std::endl;
      }
    }
    if (!args.json_only) {
      const auto steps = engine_runs.back()["step_ms"].get<std::vector<double>>();
      std::cout << fmt::format("  engine   run {}: {:8.1f} samples/s  bubble median {:.3f} (simulated {:.3f})  step ms median {:.1f} min {:.1f} max {:.1f}",
                               r + 1, engine_runs.back()["samples_per_s"].get<double>(),
                               engine_runs.back()["bubble_measured"].get<double>(),
                               engine_runs.back()["bubble_simulated"].get<double>(), median(steps),
                               *std::min_element(steps.begin(), steps.end()),
                               *std::max_element(steps.begin(), steps.end()))
                << std::endl;
    }
    if (args.skip_baseline) continue;
    baseline_runs.push_back(run_baseline(args));
    if (!args.json_only) {
      std::cout << fmt::format("  baseline run {}: {:8.1f} samples/s (one thread, no pipeline)", r + 1,
                               baseline_runs.back()["samples_per_s"].get<double>())
                << std::endl;
    }
  }
  auto med = [](const std::vector<json>& runs, const char* key) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r[key].get<double>());
    return median(v);
  };
  const double sps = med(engine_runs, "samples_per_s");
  const double fp32_sps = fp32_runs.empty() ? sps : med(fp32_runs, "samples_per_s");
  const json& fp32_first = fp32_runs.empty() ? engine_runs.front() : fp32_runs.front();
  const double base = baseline_runs.empty() ? 0.0 : med(baseline_runs, "samples_per_s");
  json out = {{"workload", args.workload.empty() ? json(nullptr) : json(args.workload)},
              {"example", args.example.empty() ? json(nullptr) : json(args.example)},
              {"stages", stages},
              {"replicas", args.replicas},
              {"micro_batches", m},
              {"schedule", engine_runs.front()["schedule"]},
              {"chunks", engine_runs.front()["chunks"]},
              {"steps", args.steps},
              {"repeats", args.repeat},
              {"samples_per_s", sps},
              {"baseline_samples_per_s", base},
              {"speedup", base > 0 ? sps / base : 0.0},
              {"gflops", med(engine_runs, "gflops")},
              {"baseline_gflops", baseline_runs.empty() ? 0.0 : med(baseline_runs, "gflops")},
              {"loss_first", engine_runs.front()["loss_first"]},
              {"loss_last", engine_runs.front()["loss_last"]},
              {"baseline_loss_first", baseline_runs.empty() ? json(nullptr) : baseline_runs.front()["loss_first"]},
              {"baseline_loss_last", baseline_runs.empty() ? json(nullptr) : baseline_runs.front()["loss_last"]},
              {"bubble_measured", med(engine_runs, "bubble_measured")},
              {"bubble_simulated", med(engine_runs, "bubble_simulated")},
              {"transfer_ms", med(engine_runs, "transfer_ms")},
              {"threads_per_rank", engine_runs.front()["threads_per_rank"]},
              {"gemm_kernel", args.gemm_kernel},
              {"bind_cores", args.bind_cores},
              // The ranks inherit PIPETRAIN_GEMM_ISA, so they run what this process would.
              {"native_gemm_isa", runtime::native_gemm_summary()},
              {"precision", args.precision},
              {"fp32_samples_per_s", fp32_sps},
              {"fp32_loss_last", fp32_first["loss_last"]},
              {"rank0_bytes_sent_per_step", engine_runs.front()["rank0_bytes_sent_per_step"]},
              {"fp32_rank0_bytes_sent_per_step", fp32_first["rank0_bytes_sent_per_step"]},
              {"deferred_linear", args.deferred_linear},
              {"peak_allocated_mb_per_stage", engine_runs.front()["peak_allocated_mb_per_stage"]},
              {"blas", blas.name}};
  if (!args.plan.empty()) {
    const PlanSpec plan = read_plan_file(args.plan);
    out["plan"] = plan_to_json(plan);
    out["predicted_samples_per_s"] = plan.predicted_samples_per_s;
    out["predicted_peak_memory_mb"] = plan.predicted_peak_memory_mb;
    if (!args.json_only)
      std::cout << fmt::format("plan: predicted {:.1f} samples/s, measured {:.1f} ({:+.1f}%)\n",
                               plan.predicted_samples_per_s, sps,
                               100.0 * (plan.predicted_samples_per_s / sps - 1.0));
  }
  if (!args.json_only && !fp32_runs.empty()) {
    std::cout << fmt::format("median: engine {} {:.1f} samples/s, engine fp32 {:.1f} samples/s, ratio {:.2f}x\n",
                             args.precision, sps, fp32_sps, sps / fp32_sps);
  }
  if (!args.json_only && base > 0) {
    std::cout << fmt::format("median: engine {:.1f} samples/s, baseline {:.1f} samples/s, speedup {:.2f}x\n", sps, base,
                             sps / base);
    std::cout << fmt::format("median bubble: measured {:.3f}, simulated {:.3f} with the measured costs\n",
                             out["bubble_measured"].get<double>(), out["bubble_simulated"].get<double>());
  }
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "run a standard workload (shared/bench/WORKLOADS.md) through the pipeline engine, with its "
      "ranks as local processes, and the plain one-thread loop in the same invocation; the last "
      "line is one JSON object (samples_per_s, baseline_samples_per_s, speedup, losses, bubble)");
  sub->add_option("--workload", args->workload, "mlp (2 stages, the default) or mlp-4 (4 stages)")
      ->check(CLI::IsMember({"mlp", "mlp-4"}));
  sub->add_option("--example", args->example, "or an example model (cnn, gpt, mlp) on one fixed step of its data")
      ->check(CLI::IsMember({"cnn", "gpt", "mlp"}));
  sub->add_option("--plan", args->plan,
                  "run the layout of a plan file (pipetrain plan's output; its last JSON line) and report its "
                  "predicted samples/s beside the measured")
      ->check(CLI::ExistingFile);
  sub->add_option("--stages", args->stages, "pipeline stages (default: the workload's)")->check(positive());
  sub->add_option("--replicas", args->replicas, "data-parallel replicas")->check(positive())->capture_default_str();
  sub->add_option("--schedule", args->schedule, "1f1b, fill-drain, interleaved, zb-h1, zb-v, dualpipev, v-half or v-min")->capture_default_str();
  sub->add_option("--chunks", args->chunks, "model chunks per stage (interleaved; default: the schedule's)");
  sub->add_option("--micro-batches", args->micro_batches, "micro-batches per step (default: the workload's 8)")
      ->check(positive());
  sub->add_option("--steps", args->steps, "timed steps")->check(positive())->capture_default_str();
  sub->add_option("--warmup", args->warmup, "untimed steps first")->check(non_negative())->capture_default_str();
  sub->add_option("--repeat", args->repeat, "runs in fresh processes; medians are reported")
      ->check(positive())
      ->capture_default_str();
  sub->add_option("--threads-per-rank", args->threads_per_rank, "intra-op threads per rank (0: cores / ranks)")
      ->capture_default_str();
  sub->add_option("--bind-cores", args->bind_cores,
                  "auto, on or off: each rank's threads on cores of their own (auto: when the ranks fill the cores)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub->add_option("--gemm-kernel", args->gemm_kernel, "auto, native, onednn or blas: the engine's Linear GEMMs")
      ->check(CLI::IsMember({"auto", "native", "onednn", "blas"}))
      ->capture_default_str();
  sub->add_option("--precision", args->precision,
                  "fp32, bf16 or fp16: what the engine computes in (fp32 master weights); a low precision "
                  "also runs the fp32 engine for comparison")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_flag("--no-deferred-linear{false}", args->deferred_linear,
                "run Linear layers through plain autograd instead of the fused weight-gradient path");
  sub->add_flag("--json", args->json_only, "print only the JSON line");
  sub->add_flag("--skip-baseline", args->skip_baseline, "do not run the one-thread baseline");
  sub->add_option("--trace", args->trace, "write the last engine step as a Chrome trace (JSON) to this file");
  sub->add_flag("--worker", args->worker, "internal: run as one rank")->group("");
  sub->add_option("--result", args->result, "internal: where rank 0 writes its result")->group("");
  sub->callback([args, &exit_code] { exit_code = run_bench(*args); });
}

}  // namespace pipetrain::apps
