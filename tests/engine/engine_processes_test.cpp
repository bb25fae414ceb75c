// PipelineEngine across real processes over Gloo: ranks spawned on 127.0.0.1 with the
// torchrun variables (as `pipetrain launch` and torchrun set them) and under mpirun. Each rank
// checks its own parameters against the one-process reference after a few steps.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "engine/engine_models.h"
#include "engine/engine_oracle.h"
#include "pipetrain/comm/rank_info.h"
#include "pipetrain/comm/threads.h"
#include "support/ranks.h"

namespace pipetrain::testing {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// The CPUs each thread of this process may run on, by thread id.
std::map<int, std::vector<int>> thread_cpus() {
  std::map<int, std::vector<int>> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    const int tid = std::stoi(e.path().filename().string());
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(tid, sizeof(set), &set) != 0) continue;  // it ended meanwhile
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out[tid].push_back(c);
  }
  return out;
}

// pipeline.bind_cores "auto" (the default): where the local ranks' threads fill the CPUs, every
// thread of a rank (its own, Gloo's) runs on the rank's CPUs; otherwise anywhere.
void expect_bound_by_default(const comm::Communicator& comm) {
  const auto info = comm::rank_info_from_env();
  const std::vector<int>& all = comm::process_cpus();
  const size_t t = static_cast<size_t>(at::get_num_threads());
  const size_t first = static_cast<size_t>(info.local_rank) * t;
  const std::vector<int> expected = static_cast<size_t>(info.local_world_size) * t == all.size()
                                        ? std::vector<int>(all.begin() + first, all.begin() + first + t)
                                        : all;
  const auto threads = thread_cpus();
  EXPECT_GE(threads.size(), 3u) << "Gloo's threads should be there";
  for (const auto& [tid, cpus] : threads) EXPECT_EQ(cpus, expected) << "thread " << tid << " of rank " << comm.rank();
}

PIPETRAIN_RANK_WORKER(engine_mlp) {
  const int stages = std::stoi(env_or("TEST_STAGES", "2"));
  OracleCase c;
  c.module = [] { return mlp(6, 16, 3, 4); };
  c.config.train_micro_batch_size_per_gpu = 4;
  c.config.gradient_accumulation_steps = 4;
  c.config.steps_per_print = 1;
  c.config.optimizer.lr = 0.05;
  c.config.pipeline.schedule = env_or("TEST_SCHEDULE", "1f1b");
  c.config.pipeline.partition_method = "uniform";
  c.config.pipeline.comm_timeout_s = 30;
  c.stages = stages;
  c.data = [](int64_t s, int r, int m) { return mlp_batch(s, r, m, 4, 6, 3); };

  auto comm = PipelineEngine::connect_from_env(c.config);
  expect_bound_by_default(*comm);
  c.replicas = comm->world_size() / stages;
  auto module = c.module();
  module.num_stages = stages;
  PipelineEngine engine(std::move(module), c.config, comm);
  std::vector<double> losses;
  for (int64_t s = 0; s < c.steps; ++s) {
    int i = 0;
    FunctionIterator it([&]() -> std::optional<MicroBatch> {
      if (i >= engine.micro_batches()) return std::nullopt;
      return c.data(s, engine.replica(), i++);
    });
    losses.push_back(engine.train_batch(it));
  }
  const auto ref = reference_run(c);
  for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], ref.losses[s], 1e-5 + 1e-4 * ref.losses[s]);
  for (const auto& [name, p] : engine.named_parameters()) {
    ASSERT_TRUE(ref.params.count(name)) << name;
    EXPECT_TRUE(torch::allclose(p, ref.params.at(name), 1e-4, 1e-6)) << name;
  }
  comm->shutdown();
}

TEST(EngineProcesses, TwoStagesOverGlooWithTorchrunVariables) {
  SpawnOptions options;
  options.nproc = 2;
  options.env = {{"TEST_STAGES", "2"}};
  auto run = spawn_workers("engine_mlp", options);
  EXPECT_TRUE(run.ok()) << run.summary();
}

TEST(EngineProcesses, TwoStagesTimesTwoReplicasZeroBubble) {
  SpawnOptions options;
  options.nproc = 4;
  options.env = {{"TEST_STAGES", "2"}, {"TEST_SCHEDULE", "zb-h1"}};
  options.time_limit = std::chrono::milliseconds(90'000);
  auto run = spawn_workers("engine_mlp", options);
  EXPECT_TRUE(run.ok()) << run.summary();
}

TEST(EngineProcesses, FourStagesUnderMpirun) {
  if (auto why = mpirun_unavailable()) GTEST_SKIP() << *why;
  SpawnOptions options;
  options.nproc = 4;
  options.env = {{"TEST_STAGES", "4"}};
  options.time_limit = std::chrono::milliseconds(90'000);
  auto run = mpirun_workers("engine_mlp", options);
  EXPECT_TRUE(run.ok()) << run.summary();
}

}  // namespace
}  // namespace pipetrain::testing
