// What the checkpoint tests share: a small config, a pipeline of in-process ranks (one thread
// each), a few training steps, and a fresh directory per test.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_models.h"
#include "pipetrain/comm/inprocess.h"
#include "pipetrain/engine/pipeline_engine.h"

namespace pipetrain::testing {

inline EngineConfig ckpt_config(int stages, const std::string& schedule = "1f1b") {
  EngineConfig c;
  c.train_micro_batch_size_per_gpu = 4;
  c.gradient_accumulation_steps = 4;
  c.steps_per_print = 0;
  c.optimizer.lr = 0.05;
  c.pipeline.schedule = schedule;
  c.pipeline.partition_method = "uniform";
  c.pipeline.stages = stages;
  c.seed = 99;
  return c;
}

// Runs `body` on every rank of a pipeline of `stages` threads.
inline void run_pipeline(int stages, const EngineConfig& config, const std::function<PipelineModule()>& make,
                         const std::function<void(PipelineEngine&)>& body) {
  auto hub = comm::InProcessHub::create(stages);
  std::vector<std::string> errors(static_cast<size_t>(stages));
  std::vector<std::thread> threads;
  for (int r = 0; r < stages; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::shared_ptr<comm::Communicator> comm = hub->endpoint(r);
        PipelineEngine engine(make(), config, comm);
        body(engine);
        comm->shutdown();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        hub->fail(r, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ASSERT_EQ(e, "");
}

// Trains steps [first, first + steps) and returns their losses.
inline std::vector<double> train_steps(PipelineEngine& engine, int steps, int64_t first) {
  std::vector<double> losses;
  for (int64_t s = first; s < first + steps; ++s) {
    int i = 0;
    FunctionIterator it([&]() -> std::optional<MicroBatch> {
      if (i >= engine.micro_batches()) return std::nullopt;
      return mlp_batch(s, 0, i++, 4, 5, 5);
    });
    losses.push_back(engine.train_batch(it));
  }
  return losses;
}

// A fixture with an empty directory of its own, named after the test, removed afterwards.
class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pipetrain-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

}  // namespace pipetrain::testing
