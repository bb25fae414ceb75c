// Random ops in the engine's stages: activation checkpointing recomputes exactly what the
// forward drew (torch::dropout, torch::rand, a Dropout inside a custom module), and ranks that
// share a process (threads) draw as separate processes do, so runs repeat bit for bit.
#include <gtest/gtest.h>

#include "engine/engine_models.h"
#include "engine/engine_oracle.h"

namespace pipetrain::testing {
namespace {

struct NestedDropoutImpl : torch::nn::Module {
  NestedDropoutImpl() { drop = register_module("drop", torch::nn::Dropout(0.3)); }
  torch::Tensor forward(torch::Tensor x) { return drop(x); }
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(NestedDropout);

// Every stage of a 2-stage split holds a Linear and random ops of each kind.
PipelineModule random_mlp() {
  PipelineModule m;
  auto functional = [](std::string name, std::function<torch::Tensor(torch::Tensor)> f) {
    return LayerSpec::make(name, name, [f] { return torch::nn::AnyModule(torch::nn::Functional(f)); });
  };
  for (int stage = 0; stage < 2; ++stage) {
    m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", stage == 0 ? 6 : 12, 12));
    m.layers.push_back(LayerSpec::make("NestedDropout", "NestedDropout", [] { return torch::nn::AnyModule(NestedDropout()); }));
    m.layers.push_back(functional("dropout", [](torch::Tensor x) { return torch::dropout(x, 0.25, true); }));
    m.layers.push_back(functional("rand", [](torch::Tensor x) { return x * (torch::rand_like(x) + 0.5); }));
  }
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 12, 3));
  m.loss = mse;
  return m;
}

OracleCase random_case(int interval) {
  OracleCase c;
  c.module = random_mlp;
  c.config = oracle_config(4, "1f1b");
  c.config.pipeline.activation_checkpoint_interval = interval;
  c.config.pipeline.partition_method = "parameters";
  c.stages = 2;
  c.steps = 3;
  c.data = [](int64_t s, int r, int m) { return mlp_batch(s, r, m, 4, 6, 3); };
  return c;
}

void expect_same(const OracleRun& a, const OracleRun& b, const std::string& what) {
  ASSERT_EQ(a.losses, b.losses) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (const auto& [name, p] : a.params) EXPECT_TRUE(torch::equal(p, b.params.at(name))) << what << ": " << name;
}

TEST(EngineRandomOps, RunsRepeatWithRanksAsThreads) {
  torch::manual_seed(1);
  const auto first = pipeline_run(random_case(0));
  torch::manual_seed(1);
  expect_same(first, pipeline_run(random_case(0)), "a second run");
}

// A recomputation that drew other numbers would give other gradients, so other parameters.
TEST(EngineRandomOps, CheckpointedStagesRecomputeTheSameDraws) {
  torch::manual_seed(2);
  const auto plain = pipeline_run(random_case(0));
  for (int interval : {1, 2, 4}) {
    torch::manual_seed(2);
    expect_same(plain, pipeline_run(random_case(interval)), "checkpoint interval " + std::to_string(interval));
  }
}

}  // namespace
}  // namespace pipetrain::testing
