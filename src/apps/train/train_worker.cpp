// One rank of `pipetrain train`: the engine over the example, progress, evaluation, trace,
// checkpoint and (on rank 0) the run directory's files.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/examples/example.h"
#include "apps/examples/reference_trainer.h"
#include "apps/plan/plan_file.h"
#include "apps/train/progress.h"
#include "apps/train/train_monitor.h"
#include "apps/train/train_worker.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/runtime/device.h"
#include "pipetrain/error.h"
#include "pipetrain/schedule/svg.h"
#include "pipetrain/schedule/trace.h"
#include "pipetrain/util/log.h"

namespace pipetrain::apps {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Remembers the labels the last stage pulls during evaluation, to score the outputs.
struct Evaluation {
  double metric = NAN;
  double loss = NAN;
};

Evaluation evaluate(PipelineEngine& engine, const examples::Example& ex) {
  // Every rank must make the same eval_batch calls (they end in collectives): agree on the
  // smallest shard, so a replica without evaluation data (mlp) does not leave the others waiting.
  const auto count = static_cast<int64_t>(engine.communicator().world().all_reduce_scalar(
      static_cast<double>(ex.eval_micro_batches(engine.replica())), comm::ReduceOp::Min, "evaluation size"));
  auto it = ex.eval_iterator(engine.replica());
  examples::MetricSum sum;
  double loss_sum = 0;
  int64_t calls = 0;
  const int m = engine.micro_batches();
  for (int64_t done = 0; done < count; done += m) {
    const int n = static_cast<int>(std::min<int64_t>(m, count - done));
    auto result = engine.eval_batch(*it, /*return_outputs=*/true, n);
    loss_sum += result.loss;
    ++calls;
    for (size_t i = 0; i < result.outputs.size() && i < result.labels.size(); ++i) {
      // Outputs stay on the last stage's device; the labels come from the host. A tensor-parallel
      // group measures together (gpt's loss over a split vocabulary); its first rank counts.
      runtime::TensorParallelScope tp(engine.tensor_parallel());
      const auto measured = ex.metric.measure(runtime::copy_to(result.outputs[i], torch::kCPU), result.labels[i]);
      if (engine.tensor_rank() == 0) sum += measured;
    }
  }
  // Only the ranks holding the last layers scored anything; every rank learns the total.
  auto totals = torch::tensor({sum.sum, sum.count}, torch::kDouble);
  std::vector<torch::Tensor> v{totals};
  engine.communicator().world().all_reduce(v, comm::ReduceOp::Sum, "evaluation metric");
  Evaluation e;
  e.metric = totals[1].item<double>() > 0 ? totals[0].item<double>() / totals[1].item<double>() : NAN;
  e.loss = calls > 0 ? loss_sum / static_cast<double>(calls) : NAN;
  return e;
}

struct PeakMemory {
  std::vector<double> host_mb;    // peak resident memory, by rank
  std::vector<double> device_mb;  // peak device allocator memory, by rank; < 0: none (CPU)
  std::vector<double> optimizer_mb;  // optimizer state (ZeRO-1: this rank's shard), by rank
};

// Every rank's peak memory in MiB.
PeakMemory peak_memory_mb(PipelineEngine& engine) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto& comm = engine.communicator();
  auto t = torch::zeros({3, comm.world_size()}, torch::kDouble);
  t[0][comm.rank()] = static_cast<double>(usage.ru_maxrss) / 1024.0;
  const auto device = runtime::peak_device_memory_bytes(engine.device());
  t[1][comm.rank()] = device ? static_cast<double>(*device) / (1024.0 * 1024.0) : -1.0;
  t[2][comm.rank()] = static_cast<double>(engine.optimizer_state_bytes()) / (1024.0 * 1024.0);
  std::vector<torch::Tensor> v{t};
  comm.world().all_reduce(v, comm::ReduceOp::Sum, "peak memory");
  const double* p = t.data_ptr<double>();
  const auto n = static_cast<size_t>(comm.world_size());
  return {std::vector<double>(p, p + n), std::vector<double>(p + n, p + 2 * n),
          std::vector<double>(p + 2 * n, p + 3 * n)};
}

int64_t total_steps(const TrainArgs& args, const examples::Example& ex) {
  if (args.steps > 0) return args.steps;
  if (args.epochs > 0) {
    if (ex.steps_per_epoch <= 0) {
      throw ConfigError("--epochs needs a data set with epochs; example \"" + ex.name + "\" has none, use --steps");
    }
    return std::max<int64_t>(1, static_cast<int64_t>(std::llround(args.epochs * static_cast<double>(ex.steps_per_epoch))));
  }
  return ex.defaults.steps;
}

}  // namespace

examples::Example make_train_example(const TrainArgs& args) {
  auto options = examples::ExampleOptions().replicas(args.replicas);
  if (args.micro_batches > 0) options.micro_batches(args.micro_batches);
  if (args.micro_batch_size > 0) options.micro_batch_size(args.micro_batch_size);
  if (args.eval_samples > 0) options.eval_samples(args.eval_samples);
  options.dropout(args.dropout);
  auto ex = examples::make_example(args.example, options);
  if (!args.config_file.empty()) {
    // A DeepSpeed config's batch sizes (train_micro_batch_size_per_gpu, gradient_accumulation_
    // steps) shape the example's data, as in `pipetrain reference`.
    const auto config = examples::example_config(ex, args.config_file, ConfigWarnings::Collect);
    examples::match_config_batches(ex, options, config, args.config_file,
                                   args.micro_batches > 0 || args.micro_batch_size > 0);
  }
  return ex;
}

EngineConfig make_train_config(const TrainArgs& args, const examples::Example& ex) {
  // Every process parses the file; rank 0 alone logs its warnings (run_train_worker).
  auto config = examples::example_config(ex, args.config_file, ConfigWarnings::Collect);
  if (!args.schedule.empty()) config.pipeline.schedule = args.schedule;
  if (!args.plan.empty()) {
    // The plan's chunks, balance and checkpointing (its layout is already on the arguments).
    auto plan = read_plan_file(args.plan);
    plan.micro_batch_size = config.train_micro_batch_size_per_gpu;
    plan.micro_batches = static_cast<int>(config.gradient_accumulation_steps);
    plan.replicas = static_cast<int>(args.replicas);
    apply_plan(plan, config);
  }
  if (!args.balance.empty()) {
    // Given by the user, or chosen from measured costs by the launching process (default_split.h).
    config.pipeline.partition_method = "balance";
    config.pipeline.balance = args.balance;
  }
  if (!args.precision.empty()) config.set_precision(args.precision);
  if (args.tensor_parallel > 0) config.tensor_parallel.size = args.tensor_parallel;
  if (args.zero_stage >= 0) {
    config.zero_optimization.stage = args.zero_stage;
    config.zero_optimization.check("--zero-stage");
  }
  const int stages = args.stages > 0 ? args.stages
                     : config.pipeline.stages > 0 ? static_cast<int>(config.pipeline.stages)
                                                  : static_cast<int>(ex.defaults.pipeline_stages);
  config.pipeline.stages = stages;
  if (config.steps_per_print <= 0) config.steps_per_print = 1000000;  // the progress bar reports instead
  return config;
}

namespace {

// The launcher's restart count (0 on the first attempt).
int restart_count() {
  for (const char* name : {"PIPETRAIN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

// Fault injection for restart drills and tests: PIPETRAIN_FAULT_KILL_STEP="RANK:STEP" makes
// that rank kill itself (SIGKILL) before step STEP of the first attempt. -1: no fault here.
int64_t fault_kill_step(int rank, int restart) {
  const char* v = std::getenv("PIPETRAIN_FAULT_KILL_STEP");
  if (!v || restart > 0) return -1;
  int r = -1;
  long long step = -1;
  if (std::sscanf(v, "%d:%lld", &r, &step) != 2) {
    throw ConfigError(fmt::format("PIPETRAIN_FAULT_KILL_STEP='{}' is not RANK:STEP (e.g. 1:3)", v));
  }
  return r == rank ? step : -1;
}

// PIPETRAIN_FAULT_KILL_CHECKPOINT="RANK:PHASE:N": that rank kills itself (SIGKILL) at PHASE
// (start, files, manifest, swap, renamed, synced: see set_checkpoint_fault_hook) of its N-th
// checkpoint save of the first attempt.
void install_checkpoint_fault(int rank, int restart) {
  const char* v = std::getenv("PIPETRAIN_FAULT_KILL_CHECKPOINT");
  if (!v || restart > 0) return;
  int r = -1, n = 0;
  char phase[16] = {0};
  if (std::sscanf(v, "%d:%15[a-z]:%d", &r, phase, &n) != 3 || n < 1) {
    throw ConfigError(fmt::format("PIPETRAIN_FAULT_KILL_CHECKPOINT='{}' is not RANK:PHASE:N (e.g. 0:manifest:2)", v));
  }
  if (r != rank) return;
  auto saves = std::make_shared<int>(0);
  const std::string target = phase;
  set_checkpoint_fault_hook([saves, target, n](const std::string& at) {
    if (at == "start") ++*saves;
    if (at == target && *saves == n) ::raise(SIGKILL);
  });
}

// A resumed run logs its steps again from `first` on: drop the lines of later steps.
void keep_metrics_until(const fs::path& path, int64_t first) {
  std::ifstream in(path);
  if (!in) return;
  std::vector<std::string> kept;
  std::string line;
  while (std::getline(in, line)) {
    try {
      if (json::parse(line).value("step", int64_t{0}) <= first) kept.push_back(line);
    } catch (const std::exception&) {
      // a line cut by the crash
    }
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : kept) out << l << "\n";
}

}  // namespace

int run_train_worker(const TrainArgs& args) {
  const double t_start = now_s();
  const auto ex = make_train_example(args);
  auto config = make_train_config(args, ex);
  config.steps_per_print = 0;
  auto comm = PipelineEngine::connect_from_env(config);
  PipelineModule module{ex.layers, ex.loss, config.pipeline.stages};
  PipelineEngine engine(std::move(module), config, comm);
  const bool lead = comm->rank() == 0;
  if (lead) {
    for (const auto& warning : config.warnings) util::log_warn(warning);
  }
  const fs::path run_dir(args.run_dir);
  const auto checkpoint_dir = (run_dir / "checkpoint").string();

  // After a restart (pipetrain launch / train --max-restarts, or torchrun) resume by ourselves.
  const int restart = restart_count();
  const bool resume = args.resume || (restart > 0 && checkpoint_step(checkpoint_dir) >= 0);
  int64_t first = 0;
  if (resume) {
    first = load_checkpoint(engine, checkpoint_dir);
    if (lead) {
      std::cout << fmt::format("resumed from {} at step {}{}", checkpoint_dir, first,
                               restart > 0 ? fmt::format(" (restart {})", restart) : "")
                << std::endl;
      keep_metrics_until(run_dir / "metrics.jsonl", first);
    }
  }
  const auto kill_at = fault_kill_step(comm->rank(), restart);
  install_checkpoint_fault(comm->rank(), restart);
  const int64_t total = total_steps(args, ex);
  const int64_t log_every = args.log_every > 0 ? args.log_every : std::max<int64_t>(1, total / 20);
  Progress progress(std::cout, first, total, lead && ::isatty(STDOUT_FILENO), log_every);
  std::ofstream metrics;
  std::unique_ptr<TrainMonitor> monitor;
  if (lead) {
    metrics.open(run_dir / "metrics.jsonl", resume ? std::ios::app : std::ios::trunc);
    monitor = std::make_unique<TrainMonitor>(tensorboard_dir(config.tensorboard, run_dir));
  }

  double train_seconds = 0;
  int64_t samples = 0;
  double last_loss = NAN;
  std::vector<json> evals;
  auto run_eval = [&](int64_t step) {
    const auto e = evaluate(engine, ex);
    evals.push_back({{"step", step}, {ex.metric.name, e.metric}, {"eval_loss", e.loss}});
    if (lead) {
      progress.note(fmt::format("step {}: {} {:.4f}, eval loss {:.4f}", step, ex.metric.name, e.metric, e.loss));
      metrics << json({{"step", step}, {"eval_" + ex.metric.name, e.metric}, {"eval_loss", e.loss}}).dump() << "\n";
      monitor->evaluation(step * config.train_batch_size, ex.metric.name, e.metric, e.loss);
    }
    return e;
  };
  for (int64_t step = first; step < total; ++step) {
    if (kill_at == step) ::raise(SIGKILL);
    auto it = ex.train_iterator(engine.replica(), step, 1);
    const double t0 = now_s();
    last_loss = engine.train_batch(*it);
    const double dt = now_s() - t0;
    train_seconds += dt;
    samples += config.train_batch_size;
    const double sps = static_cast<double>(config.train_batch_size) / dt;
    if (lead) {
      progress.update(step + 1, last_loss, sps);
      metrics << json({{"step", step + 1}, {"loss", last_loss}, {"lr", engine.last_step().lr},
                       {"samples_per_s", sps}, {"seconds", dt}})
                     .dump()
              << "\n";
      metrics.flush();
      // DeepSpeed's step for Train/Samples/* is the number of samples trained so far.
      monitor->step((step + 1) * config.train_batch_size, last_loss, engine.last_step().lr, engine.loss_scale(),
                    sps);
    }
    if (args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 < total) run_eval(step + 1);
    if (args.checkpoint_every > 0 && (step + 1) % args.checkpoint_every == 0 && step + 1 < total) {
      save_checkpoint(engine, checkpoint_dir, json({{"example", ex.name}}).dump());
    }
  }
  progress.finish();

  // The last step's timeline, measured, next to the simulator's prediction.
  BubbleReport bubble;
  std::vector<schedule::TimedEvent> events;
  if (total > first) {
    events = engine.gather_events();
    bubble = engine.measure_bubble();
  }
  const auto final_eval = run_eval(total);
  const auto memory = peak_memory_mb(engine);
  save_checkpoint(engine, checkpoint_dir, json({{"example", ex.name}}).dump());

  if (lead) {
    if (!events.empty()) {
      schedule::TraceOptions trace;
      trace.microseconds_per_unit = 1e6;
      trace.process_name = "pipetrain train " + ex.name;
      std::ofstream(run_dir / "trace.json") << schedule::render_chrome_trace(events, trace);
      schedule::SvgOptions svg;
      svg.title = fmt::format("{} on {} stages, measured step {} (bubble {:.1f}%, simulated {:.1f}%)",
                              schedule::kind_name(engine.train_schedule().kind), engine.num_stages(), total,
                              100 * bubble.measured, 100 * bubble.simulated);
      std::ofstream(run_dir / "timeline.svg") << schedule::render_svg(events, svg);
    }
    json per_rank = json::array();
    const auto& topo = engine.topology();
    for (int r = 0; r < comm->world_size(); ++r) {
      // What this rank's optimizer state would be without ZeRO-1: its stage's shards together.
      double unsharded = 0;
      for (int q : topo.data_parallel_ranks(topo.stage_of(r), topo.tensor_of(r))) unsharded += memory.optimizer_mb[static_cast<size_t>(q)];
      per_rank.push_back({{"rank", r},
                          {"stage", topo.stage_of(r)},
                          {"replica", topo.replica_of(r)},
                          {"tensor", topo.tensor_of(r)},
                          {"optimizer_state_mb", memory.optimizer_mb[static_cast<size_t>(r)]},
                          {"optimizer_state_mb_without_zero",
                           engine.zero_partition().replicas() > 1 ? unsharded : memory.optimizer_mb[static_cast<size_t>(r)]},
                          {"peak_memory_mb", memory.host_mb[static_cast<size_t>(r)]},
                          {"peak_device_memory_mb", memory.device_mb[static_cast<size_t>(r)] < 0
                                                        ? json(nullptr)
                                                        : json(memory.device_mb[static_cast<size_t>(r)])}});
    }
    json summary = {{"example", ex.name},
                    {"device", engine.device().str()},
                    {"stages", engine.num_stages()},
                    {"replicas", engine.num_replicas()},
                    {"zero_stage", config.zero_optimization.stage},
                    {"tensor_parallel", engine.tensor_parallel_size()},
                    {"micro_batches", engine.micro_batches()},
                    {"micro_batch_size", config.train_micro_batch_size_per_gpu},
                    {"balance", engine.balance()},
                    {"schedule", schedule::kind_name(engine.train_schedule().kind)},
                    {"precision", config.precision()},
                    {"steps", total},
                    {"first_step", first},
                    {"final_loss", last_loss},
                    {"metric", ex.metric.name},
                    {ex.metric.name, final_eval.metric},
                    {"eval_loss", final_eval.loss},
                    {"evaluations", evals},
                    {"train_seconds", train_seconds},
                    {"wall_seconds", now_s() - t_start},
                    {"samples_per_s", train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0.0},
                    {"bubble_measured", bubble.measured},
                    {"bubble_simulated", bubble.simulated},
                    {"ranks", per_rank},
                    {"run_dir", run_dir.string()},
                    {"tensorboard", monitor->path().parent_path().string()}};
    std::ofstream(run_dir / "summary.json") << summary.dump(2) << "\n";
  }
  comm->shutdown();
  return 0;
}

}  // namespace pipetrain::apps
