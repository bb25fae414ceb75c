// `pipetrain plan`, its JSON line, and `bench --plan` / `train --plan` reading it back.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/plan/plan_file.h"
#include "apps/train/train_args.h"
#include "cli_runner.h"
#include "pipetrain/comm/threads.h"
#include "pipetrain/error.h"
#include "support/child_process.h"

namespace pipetrain::apps {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

PlanSpec sample_plan() {
  PlanSpec p;
  p.workload = "mlp";
  p.processes = 2;
  p.stages = 2;
  p.replicas = 1;
  p.micro_batches = 4;
  p.micro_batch_size = 64;
  p.schedule = "interleaved";
  p.chunks = 2;
  p.balance = {8, 8, 8, 8};
  p.checkpoint = 8;
  p.predicted_samples_per_s = 1234.5;
  p.predicted_step_ms = 207.4;
  p.predicted_peak_memory_mb = 150.25;
  p.predicted_peak_memory_mb_per_stage = {150.25, 140.0};
  return p;
}

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::ofstream(path) << text;
  return path;
}

TEST(PlanFile, RoundTripsAndAppliesToTheEngineConfig) {
  const PlanSpec p = sample_plan();
  const PlanSpec back = plan_from_json(json::parse(plan_to_json(p).dump()));
  EXPECT_EQ(back.workload, "mlp");
  EXPECT_TRUE(back.example.empty());
  EXPECT_EQ(back.stages, 2);
  EXPECT_EQ(back.micro_batches, 4);
  EXPECT_EQ(back.micro_batch_size, 64);
  EXPECT_EQ(back.schedule, "interleaved");
  EXPECT_EQ(back.chunks, 2);
  EXPECT_EQ(back.balance, p.balance);
  EXPECT_EQ(back.checkpoint, 8);
  EXPECT_DOUBLE_EQ(back.predicted_samples_per_s, 1234.5);
  EXPECT_EQ(back.predicted_peak_memory_mb_per_stage, p.predicted_peak_memory_mb_per_stage);

  EngineConfig c;
  apply_plan(back, c);
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_EQ(c.pipeline.schedule, "interleaved");
  EXPECT_EQ(c.pipeline.chunks, 2);
  EXPECT_EQ(c.pipeline.partition_method, "balance");
  EXPECT_EQ(c.pipeline.balance, p.balance);
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 64);
  EXPECT_EQ(c.train_batch_size, 256);
}

TEST(PlanFile, TheLastJsonLineOfAWholeOutputIsThePlan) {
  PlanSpec first = sample_plan();
  first.stages = 1;
  first.balance = {32};
  first.chunks = 1;
  const auto path = write_temp("plan-file", "workload mlp: ...\nplan: ...\n" + plan_to_json(first).dump() + "\n" +
                                                plan_to_json(sample_plan()).dump() + "\n\n");
  EXPECT_EQ(read_plan_file(path.string()).stages, 2);

  TrainArgs args;
  args.plan = path.string();
  apply_plan_file(args, /*example_given=*/false);
  EXPECT_EQ(args.example, "mlp");  // the workloads are the mlp example's model
  EXPECT_EQ(args.stages, 2);
  EXPECT_EQ(args.micro_batches, 4);
  EXPECT_EQ(args.micro_batch_size, 64);
  EXPECT_EQ(args.schedule, "interleaved");
  TrainArgs other;
  other.plan = path.string();
  other.example = "cnn";
  EXPECT_THROW(apply_plan_file(other, /*example_given=*/true), ConfigError);
  fs::remove(path);
}

TEST(PlanFile, MalformedPlansAreConfigErrorsNamingTheField) {
  auto j = json::parse(plan_to_json(sample_plan()).dump());
  j.erase("balance");
  try {
    plan_from_json(j);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"balance\""), std::string::npos) << e.what();
  }
  j = json::parse(plan_to_json(sample_plan()).dump());
  j["balance"] = {16, 16};  // 2 stages x 2 chunks need 4 parts
  EXPECT_THROW(plan_from_json(j), ConfigError);
  const auto empty = write_temp("plan-empty", "no json here\n");
  EXPECT_THROW(read_plan_file(empty.string()), ConfigError);
  fs::remove(empty);
}

// The bar's contract: plan --json ends with the fields; bench --plan runs it and echoes the
// prediction; the measured peak memory per stage is within the memory model's tolerance.
TEST(PlanCommand, PlanThenBenchThePlan) {
  const auto r = testing::run({"plan", "--workload", "mlp", "--json", "--budget-ms", "10", "--max-micro-batches", "8"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json plan = json::parse(testing::last_line(r.out));
  for (const char* key : {"predicted_samples_per_s", "stages", "replicas", "micro_batches", "schedule", "balance",
                          "checkpoint", "predicted_peak_memory_mb"})
    EXPECT_TRUE(plan.contains(key)) << key << " missing from " << plan.dump();
  EXPECT_GT(plan["predicted_samples_per_s"].get<double>(), 0);
  EXPECT_EQ(plan["stages"].get<int>() * plan["replicas"].get<int>(), 2);
  int64_t layers = 0;
  for (const auto& b : plan["balance"]) layers += b.get<int64_t>();
  EXPECT_EQ(layers, 32);
  // A bound on a runaway search, not a speed claim: profiling and search took 3-5 s on one machine
  // and 9-11.5 s on a slower one of the same kind (2026-12-07).
  EXPECT_LT(plan["search_s"].get<double>(), 30.0);
  // The profile's thread, bound beside its helper where they fill the CPUs, is let go after.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  ASSERT_EQ(::sched_getaffinity(0, sizeof mine, &mine), 0);
  EXPECT_EQ(static_cast<size_t>(CPU_COUNT(&mine)), comm::process_cpus().size());
  // Without the other rank's work running beside the profile: a plan of the same form.
  const auto alone = testing::run({"plan", "--workload", "mlp", "--json", "--budget-ms", "10", "--max-micro-batches",
                                   "8", "--profile-alone"});
  ASSERT_EQ(alone.code, 0) << alone.err;
  EXPECT_GT(json::parse(testing::last_line(alone.out))["predicted_samples_per_s"].get<double>(), 0);

  const auto file = write_temp("plan-out", r.out);
  const fs::path log = fs::temp_directory_path() / ("pipetrain-plan-bench-" + std::to_string(::getpid()) + ".log");
  pipetrain::testing::ChildProcess bench({PIPETRAIN_CLI_PATH, "bench", "--plan", file.string(), "--steps", "2",
                                          "--warmup", "1", "--json"},
                                         log.string());
  const int code = bench.wait(150s);
  const std::string output = bench.output();
  fs::remove(log);
  fs::remove(file);
  ASSERT_EQ(code, 0) << output;
  const json b = json::parse(testing::last_line(output));
  EXPECT_GT(b["samples_per_s"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(b["predicted_samples_per_s"].get<double>(), plan["predicted_samples_per_s"].get<double>());
  EXPECT_EQ(b["stages"], plan["stages"]);
  EXPECT_EQ(b["micro_batches"], plan["micro_batches"]);
  EXPECT_EQ(b["schedule"], plan["schedule"]);
  // Memory: the model against the engine's counted allocations, stage by stage.
  const auto predicted = plan["predicted_peak_memory_mb_per_stage"].get<std::vector<double>>();
  const auto measured = b["peak_allocated_mb_per_stage"].get<std::vector<double>>();
  ASSERT_EQ(predicted.size(), measured.size());
  for (size_t j = 0; j < predicted.size(); ++j)
    EXPECT_NEAR(predicted[j], measured[j], 0.15 * measured[j]) << "stage " << j;
}

// Four ranks on two cores (or whatever this machine has: --cores pins it): the plan is
// simulated with the ranks sharing the cores, so what sharing costs moves the prediction.
TEST(PlanCommand, MoreProcessesThanCoresPayForSharingThem) {
  const std::vector<std::string> args{"plan",       "--workload", "mlp-4", "--processes", "4", "--cores", "2",
                                      "--stages",   "4",          "--schedule", "1f1b", "--micro-batches", "2",
                                      "--budget-ms", "10",        "--json"};
  auto predicted = [&args](const char* efficiency) {
    ::setenv("PIPETRAIN_PLAN_SHARED_EFFICIENCY", efficiency, 1);
    const auto r = testing::run(args);
    ::unsetenv("PIPETRAIN_PLAN_SHARED_EFFICIENCY");
    EXPECT_EQ(r.code, 0) << r.err;
    return json::parse(testing::last_line(r.out))["predicted_samples_per_s"].get<double>();
  };
  // Each plan profiles the layers anew, and under other tests' load two profiles can differ by
  // 20% (a fresh-machine run saw 1.04x): the pair is measured again, up to three times, and
  // one pair must show the cost. A planner that ignores sharing fails every try.
  double ratio = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const double free_switching = predicted("1");
    const double costly = predicted("0.5");
    ASSERT_GT(free_switching, 0);
    ratio = costly / free_switching;
    if (ratio < 0.85) break;
  }
  // Half the speed while the ranks outnumber the cores: far slower, though not half, as the
  // pipeline's fill and drain leave some ranks without work (profiles differ by a few %).
  EXPECT_LT(ratio, 0.85);
  EXPECT_GT(ratio, 0.5);
}

}  // namespace
}  // namespace pipetrain::apps
