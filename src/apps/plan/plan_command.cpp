// `pipetrain plan`: profile a model's layers once, search every layout over N processes with
// the simulator and the memory model (schedule/plan.h), print the best and the runners-up;
// the last line is the chosen plan as JSON (plan_file.h) for `train --plan` / `bench --plan`.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "apps/bench/bench_subject.h"
#include "apps/commands.h"
#include "apps/plan/plan_calibration.h"
#include "apps/plan/profile_costs.h"
#include "apps/plan/plan_file.h"
#include "apps/plan/plan_profile_file.h"
#include "pipetrain/comm/threads.h"
#include "pipetrain/error.h"
#include "pipetrain/runtime/gemm.h"
#include "pipetrain/runtime/layer_profile.h"
#include "pipetrain/schedule/memory.h"
#include "pipetrain/schedule/plan.h"

namespace pipetrain::apps {
namespace {

struct PlanArgs {
  std::string workload, example;
  double max_memory_mb = 0;
  int processes = 0;  // 0: the subject's default stages
  int cores = 0;      // 0: this machine's
  int max_micro_batches = 32;
  int budget_ms = 120;  // timing per micro-batch size
  int runners_up = 5;
  bool json_only = false;
  bool show_profile = false;
  bool profile_alone = false;
  std::string gemm_kernel = "auto";
  std::string save_profile, load_profile;  // plan_profile_file.h
  // Restrict the search (to predict one layout, e.g. for scripts/plan-grid.sh).
  std::vector<int> stages, micro_batches;
  std::vector<std::string> schedules;
};

double mib(double bytes) { return bytes / (1 << 20); }

// The run's other ranks, computing beside the profile on the other cores: in the run they share
// the memory bandwidth and caches with every rank, and what else loads the machine now loads
// it then too, so the layers are timed as they will run. Where the profile and its helpers
// fill the CPUs, each has CPUs of its own, as `auto` binds the ranks of a run that fills them
// (docs/comm.md), so that a helper never takes turns with the profile on its core.
class BusyRanks {
 public:
  BusyRanks(int count, int threads, const std::function<void()>& work) {
    const auto& cpus = comm::process_cpus();
    const int world = count + 1;  // the profile is "rank" 0
    const bool fits = world * threads <= static_cast<int>(cpus.size());
    auto cpus_of = [&](int rank) {
      return fits ? comm::plan_core_binding("on", cpus, rank, world, threads) : std::vector<int>{};
    };
    comm::bind_this_thread(cpus_of(0));
    for (int i = 0; i < count; ++i) {
      const auto own = cpus_of(i + 1);
      threads_.emplace_back([this, work, own] {
        try {
          comm::bind_this_thread(own);
          while (!stop_.load()) work();
        } catch (const std::exception&) {
          // the profile itself runs the same work and reports its error
        }
      });
    }
  }
  ~BusyRanks() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    comm::bind_this_thread(comm::process_cpus());  // the profile's thread, as it was
  }
  BusyRanks(const BusyRanks&) = delete;
  BusyRanks& operator=(const BusyRanks&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

PlanSpec to_spec(const PlanArgs& a, const schedule::Plan& p, int64_t rows) {
  PlanSpec s;
  s.workload = a.workload;
  s.example = a.example;
  s.processes = p.stages * p.replicas;
  s.stages = p.stages;
  s.replicas = p.replicas;
  s.micro_batches = p.micro_batches;
  s.micro_batch_size = rows / p.micro_batches;
  s.schedule = schedule::kind_name(p.kind);
  s.chunks = p.chunks;
  s.balance = p.balance;
  s.checkpoint = p.checkpoint;
  s.predicted_samples_per_s = p.samples_per_s;
  s.predicted_step_ms = p.step_s * 1e3;
  s.predicted_peak_memory_mb = mib(p.max_peak_memory_bytes());
  for (double b : p.peak_memory_bytes) s.predicted_peak_memory_mb_per_stage.push_back(mib(b));
  return s;
}

std::string describe(const schedule::Plan& p) {
  return fmt::format("{} x {} {}{} M={} ckpt={} balance [{}]", p.stages, p.replicas, schedule::kind_name(p.kind),
                     p.chunks > 1 ? fmt::format(" V={}", p.chunks) : "", p.micro_batches, p.checkpoint,
                     fmt::join(p.balance, ","));
}

int run_plan(const PlanArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const BenchShape shape = bench_shape(a.workload, a.example);
  const int processes = a.processes > 0 ? a.processes : shape.stages;
  const int cores = a.cores > 0 ? a.cores : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The ranks will run with cores / processes threads each (the launcher's rule): profile so.
  const int saved_threads = at::get_num_threads();
  comm::apply_threads(std::max(1, cores / processes));

  schedule::PlanSearchOptions o;
  o.processes = processes;
  o.cores = cores;
  o.batch_rows = static_cast<int>(shape.rows);
  o.max_memory_bytes = a.max_memory_mb * (1 << 20);
  const Calibration cal = calibration();
  o.link = cal.link;
  o.step_overhead_s = cal.step_overhead_s;
  o.shared_efficiency = cal.shared_efficiency;
  o.shared_message_s = cal.shared_message_s;
  o.stage_counts = a.stages;
  for (const auto& name : a.schedules) o.kinds.push_back(schedule::parse_kind(name));
  const int max_m = a.micro_batches.empty() ? a.max_micro_batches
                                            : *std::max_element(a.micro_batches.begin(), a.micro_batches.end());
  // What this plan profiles (or takes from --load-profile): the costs at each micro-batch count.
  PlanProfile measured;
  measured.workload = a.workload;
  measured.example = a.example;
  measured.gemm_kernel = a.gemm_kernel;
  measured.processes = processes;
  measured.cores = cores;
  measured.profile_alone = a.profile_alone;
  std::vector<int> counts;
  for (int m = 1; m <= max_m && m <= shape.rows; m *= 2) {
    if (shape.rows % m != 0) continue;
    if (!a.micro_batches.empty() && std::find(a.micro_batches.begin(), a.micro_batches.end(), m) == a.micro_batches.end())
      continue;
    counts.push_back(m);
  }
  if (!a.load_profile.empty()) {
    PlanProfile wanted = measured;
    for (int m : counts) wanted.costs[m];
    const PlanProfile loaded = load_plan_profile(a.load_profile);
    check_profile_matches(loaded, wanted, a.load_profile);
    for (int m : counts) measured.costs[m] = loaded.costs.at(m);
    measured.optimizer = loaded.optimizer;
    measured.optimizer_state_factor = loaded.optimizer_state_factor;
    measured.fill_waits = loaded.fill_waits;
    // The environment's bandwidth, when set, still overrides the measured one.
    measured.stream_bytes_per_s =
        std::getenv("PIPETRAIN_PLAN_STREAM_MBS") ? stream_bytes_per_s() : loaded.stream_bytes_per_s;
  }
  for (int m : a.load_profile.empty() ? counts : std::vector<int>{}) {
    auto subject = bench_subject(a.workload, a.example, m, 0, 1);
    runtime::LayerProfileOptions po;
    po.budget = std::chrono::milliseconds(a.budget_ms);
    po.stage.gemm_kernel = runtime::parse_gemm_kernel(a.gemm_kernel);
    po.optimizer = subject.config.optimizer.type;
    measured.optimizer = subject.config.optimizer.type;
    measured.optimizer_state_factor =
        schedule::optimizer_state_factor(measured.optimizer, subject.config.optimizer.momentum);
    std::optional<BusyRanks> others;
    if (!a.profile_alone) {
      runtime::LayerProfileOptions busy = po;
      busy.budget = std::chrono::milliseconds(100);
      others.emplace(std::min(processes, cores) - 1, std::max(1, cores / processes), [&subject, busy] {
        runtime::profile_layers(subject.module.layers, subject.micro_batches.front().inputs, busy);
      });
    }
    const auto profile = runtime::profile_layers(subject.module.layers, subject.micro_batches.front().inputs, po);
    others.reset();
    measured.fill_waits = profile.accumulates_natively;
    if (a.show_profile) {
      std::cout << fmt::format("profile at {} micro-batches of {} rows (ms, MiB):\n  layer  forward  input-grad  weight-grad  "
                               "optimizer  activation  output  params  state\n",
                               m, profile.rows);
      for (size_t i = 0; i < profile.layers.size(); ++i) {
        const auto& l = profile.layers[i];
        std::cout << fmt::format("  {:5}  {:7.3f}  {:10.3f}  {:11.3f}  {:9.3f}  {:10.3f}  {:6.3f}  {:6.2f}  {:5.2f}\n", i,
                                 l.forward_s * 1e3, l.backward_input_s * 1e3, l.backward_weight_s * 1e3,
                                 l.optimizer_s * 1e3, mib(l.activation_bytes), mib(l.output_bytes), mib(l.param_bytes),
                                 mib(l.state_bytes));
      }
    }
    measured.costs[m] = layer_costs(profile);
  }
  if (a.load_profile.empty()) {
    // The optimizer step's memory traffic, measured beside the other ranks' updates: every rank
    // updates once the gradient norm is agreed, so they stream at the same time (not beside
    // whichever layers' work the helpers happened to run).
    std::optional<BusyRanks> updates;
    if (!a.profile_alone) {
      torch::NoGradGuard no_grad;
      auto arrays = std::make_shared<std::pair<torch::Tensor, torch::Tensor>>(torch::ones({16 << 20}),
                                                                               torch::ones({16 << 20}));
      updates.emplace(std::min(processes, cores) - 1, std::max(1, cores / processes), [arrays] {
        torch::NoGradGuard guard;
        arrays->first.add_(arrays->second, -1e-9f);
      });
    }
    measured.stream_bytes_per_s = stream_bytes_per_s();
  }
  if (!a.save_profile.empty()) save_plan_profile(measured, a.save_profile);
  // The engine's compute against the profiled (the calibration's scale), applied to a loaded
  // profile as to a measured one.
  for (const auto& [m, measured_costs] : measured.costs) {
    schedule::LayerCosts c = measured_costs;
    for (auto* v : {&c.forward, &c.backward_input, &c.backward_weight})
      for (double& t : *v) t *= cal.compute_scale;
    o.costs[m] = std::move(c);
  }
  const std::string& optimizer = measured.optimizer;
  o.optimizer_state_factor = measured.optimizer_state_factor;
  o.fill_waits = measured.fill_waits;
  o.stream_bytes_per_s = measured.stream_bytes_per_s;
  comm::apply_threads(saved_threads);
  const auto profiled = std::chrono::steady_clock::now();
  const auto plans = schedule::search_plans(o);
  const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double profile_s = std::chrono::duration<double>(profiled - t0).count();

  const PlanSpec best = to_spec(a, plans.front(), shape.rows);
  if (!a.json_only) {
    std::cout << fmt::format("{} {}: {} layers, {} rows per step, {} processes on {} cores, optimizer {}{}\n",
                             a.workload.empty() ? "example" : "workload",
                             a.workload.empty() ? a.example : a.workload, o.costs.begin()->second.forward.size(),
                             shape.rows, processes, cores, optimizer,
                             a.max_memory_mb > 0 ? fmt::format(", memory cap {:.0f} MiB", a.max_memory_mb) : "");
    std::cout << fmt::format("searched {} layouts that fit in {:.2f} s ({:.2f} s profiling; optimizer steps stream "
                             "{:.1f} GB/s)\n",
                             plans.size(), search_s, profile_s, o.stream_bytes_per_s / 1e9);
    std::cout << fmt::format("plan: {}\n  predicted {:.1f} samples/s (step {:.1f} ms, bubble {:.1f}%), peak memory "
                             "{:.1f} MiB per stage [{}]\n",
                             describe(plans.front()), best.predicted_samples_per_s, best.predicted_step_ms,
                             100 * plans.front().bubble, best.predicted_peak_memory_mb,
                             fmt::join(best.predicted_peak_memory_mb_per_stage, ", "));
    std::cout << "runners-up:\n";
    for (size_t i = 1; i < plans.size() && static_cast<int>(i) <= a.runners_up; ++i)
      std::cout << fmt::format("  {:8.1f} samples/s  {:7.1f} MiB  {}\n", plans[i].samples_per_s,
                               mib(plans[i].max_peak_memory_bytes()), describe(plans[i]));
  }
  auto j = plan_to_json(best);
  j["search_s"] = search_s;
  // The work done, counted (tests bound these, not the seconds, which depend on the machine's load).
  j["layouts_searched"] = plans.size();
  std::vector<int> counted;
  for (const auto& [m, c] : o.costs) counted.push_back(m);
  j["micro_batch_counts"] = counted;
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "profile a model's layers once and choose its pipeline: stages, replicas, micro-batches, schedule, "
      "balance and activation checkpointing under a memory cap, predicted by the simulator; the last line "
      "is the plan as JSON (for train --plan and bench --plan)");
  sub->add_option("--workload", args->workload, "a benchmark workload: mlp or mlp-4")
      ->check(CLI::IsMember({"mlp", "mlp-4"}));
  sub->add_option("--example", args->example, "or an example model: cnn, gpt or mlp")
      ->check(CLI::IsMember({"cnn", "gpt", "mlp"}));
  sub->add_option("--max-memory-mb", args->max_memory_mb, "per-process memory cap in MiB (0: none)")
      ->check(non_negative());
  sub->add_option("--processes", args->processes, "processes to use: stages x replicas (default: the "
                                                  "workload's or example's stages)")
      ->check(positive());
  sub->add_option("--cores", args->cores, "CPU cores the processes share (default: this machine's)")
      ->check(positive());
  sub->add_option("--max-micro-batches", args->max_micro_batches, "largest micro-batch count tried (powers of 2)")
      ->check(positive())
      ->capture_default_str();
  sub->add_option("--budget-ms", args->budget_ms, "profiling time per micro-batch size")
      ->check(positive())
      ->capture_default_str();
  sub->add_option("--gemm-kernel", args->gemm_kernel, "the engine's Linear kernel to profile: auto, native, onednn, blas")
      ->check(CLI::IsMember({"auto", "native", "onednn", "blas"}))
      ->capture_default_str();
  sub->add_option("--stages", args->stages, "only these stage counts")->check(positive());
  sub->add_option("--micro-batches", args->micro_batches, "only these micro-batch counts")->check(positive());
  sub->add_option("--schedule", args->schedules, "only these schedule kinds");
  sub->add_flag("--show-profile", args->show_profile, "print each layer's profiled costs");
  sub->add_flag("--profile-alone", args->profile_alone,
                "profile without the other ranks' work running beside (by default min(processes, cores) - 1 "
                "threads compute the same layers meanwhile, as the run's other ranks will)");
  sub->add_option("--save-profile", args->save_profile,
                  "write the profiled costs to this file (JSON), for later plans with --load-profile");
  sub->add_option("--load-profile", args->load_profile,
                  "plan from costs saved by --save-profile (same model, processes, cores and kernel) "
                  "instead of profiling again");
  sub->add_flag("--json", args->json_only, "print only the JSON line");
  sub->callback([args, &exit_code] {
    if (args->workload.empty() && args->example.empty()) args->workload = "mlp";
    if (!args->load_profile.empty() && args->show_profile)
      throw UsageError("--show-profile prints a profile as it is measured, and --load-profile measures none: "
                       "use --show-profile with the run that writes the file (--save-profile)");
    exit_code = run_plan(*args);
  });
}

}  // namespace pipetrain::apps
