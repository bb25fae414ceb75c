// ZeRO-1: the optimizer state sharded across data-parallel replicas. The run equals the same
// run without ZeRO (and so the model in one process), each replica keeps about 1/D of the
// state, and its per-layer checkpoints resume under any other layout, with or without ZeRO.
#include "pipetrain/engine/zero_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "engine/checkpoint_support.h"
#include "engine/engine_models.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/error.h"

namespace pipetrain::testing {
namespace {

namespace fs = std::filesystem;

TEST(ZeroPartition, ShardsAreBalancedDisjointAndTheSameOnEveryReplica) {
  std::vector<torch::Tensor> params;
  for (int64_t n : {100, 7, 60, 60, 3, 40, 1}) params.push_back(torch::zeros({n}));
  const ZeroPartition first(params, 3, 0);
  for (int r = 0; r < 3; ++r) {
    const ZeroPartition z(params, 3, r);
    size_t mine = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(z.owner(i), first.owner(i)) << "parameter " << i;
      if (z.owner(i) == r) ++mine;
    }
    EXPECT_EQ(z.owned(params).size(), mine) << "replica " << r;
  }
  // Largest first onto the lightest shard: within one parameter of each other.
  const ZeroPartition& z = first;
  int64_t total = 0;
  for (auto n : z.shard_numel()) total += n;
  EXPECT_EQ(total, 271);
  const auto [lo, hi] = std::minmax_element(z.shard_numel().begin(), z.shard_numel().end());
  EXPECT_LE(*hi - *lo, 100);
  EXPECT_EQ(z.shard_numel(), (std::vector<int64_t>{100, 100, 71}));
  EXPECT_THROW(ZeroPartition(params, 2, 2), ConfigError);
  EXPECT_THROW(ZeroPartition(params, 0, 0), ConfigError);
}

TEST(ZeroPartition, OptimizerStateBytesCountEveryMoment) {
  auto w = torch::zeros({10, 10}, torch::requires_grad());
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1));
  EXPECT_EQ(optimizer_state_bytes(adam), 0);
  w.mutable_grad() = torch::ones({10, 10});
  adam.step();
  EXPECT_EQ(optimizer_state_bytes(adam), 2 * 100 * 4);  // exp_avg and exp_avg_sq, float32
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  sgd.step();
  EXPECT_EQ(optimizer_state_bytes(sgd), 100 * 4);
}

EngineConfig zero_config(int stages, int zero_stage, int micro_batches) {
  auto c = ckpt_config(stages);
  c.optimizer.type = "Adam";
  c.optimizer.lr = 0.01;
  c.gradient_accumulation_steps = micro_batches;
  c.gradient_clipping = 0.5;  // the global norm must be the whole model's under ZeRO too
  c.zero_optimization.stage = zero_stage;
  return c;
}

// Steps [first, first + steps): the global batch of every step is the same 4 micro-batches
// whatever the replica count (replica r takes r M .. r M + M - 1).
std::vector<double> train_global(PipelineEngine& engine, int steps, int64_t first) {
  std::vector<double> losses;
  for (int64_t s = first; s < first + steps; ++s) {
    int i = 0;
    FunctionIterator it([&]() -> std::optional<MicroBatch> {
      if (i >= engine.micro_batches()) return std::nullopt;
      return mlp_batch(s, 0, engine.replica() * engine.micro_batches() + i++, 4, 5, 5);
    });
    losses.push_back(engine.train_batch(it));
  }
  return losses;
}

struct ZeroRun {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;  // by "<layer>.<name>", replica 0
  std::vector<int64_t> state_bytes;             // by rank
};

// `ranks` threads in `stages` stages; loads `load` first when given, saves into `save` after
// `save_after` steps when given.
ZeroRun run(int ranks, const EngineConfig& config, int steps, int64_t first = 0, const std::string& load = "",
        const std::string& save = "", int save_after = 0) {
  ZeroRun out;
  out.state_bytes.assign(static_cast<size_t>(ranks), 0);
  std::mutex mutex;
  run_pipeline(ranks, config, [] { return mlp(5, 12, 5, 4); }, [&](PipelineEngine& engine) {
    if (!load.empty()) {
      EXPECT_EQ(load_checkpoint(engine, load), first);
    }
    std::vector<double> losses = train_global(engine, save.empty() ? steps : save_after, first);
    if (!save.empty()) {
      save_checkpoint(engine, save);
      const auto more = train_global(engine, steps - save_after, first + save_after);
      losses.insert(losses.end(), more.begin(), more.end());
    }
    std::lock_guard<std::mutex> lock(mutex);
    out.state_bytes[static_cast<size_t>(engine.communicator().rank())] = engine.optimizer_state_bytes();
    if (engine.communicator().rank() == 0) out.losses = losses;
    if (engine.replica() == 0) {
      for (const auto& [name, p] : engine.named_parameters()) out.params[name] = p.detach().clone();
    }
  });
  return out;
}

void expect_same_run(const ZeroRun& a, const ZeroRun& b, double rel) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], rel * std::abs(a.losses[i])) << "step " << i;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, p] : a.params) {
    ASSERT_TRUE(b.params.count(name)) << name;
    EXPECT_TRUE(torch::allclose(p, b.params.at(name), 1e-5, 1e-6)) << name;
  }
}

TEST(Zero1, EqualsTheRunWithoutShardingAndHalvesTheState) {
  // 2 stages x 2 replicas with ZeRO-1, without it, and 2 stages x 1 replica taking the whole
  // batch: the same losses at every step and the same parameters after 4 steps.
  const ZeroRun sharded = run(4, zero_config(2, 1, 2), 4);
  const ZeroRun plain = run(4, zero_config(2, 0, 2), 4);
  const ZeroRun one = run(2, zero_config(2, 0, 4), 4);
  expect_same_run(plain, sharded, 1e-6);
  expect_same_run(one, sharded, 1e-5);
  EXPECT_LT(sharded.losses[3], sharded.losses[0]);
  // Ranks 0/1 are stage 0's replicas: their shards add up to the state one replica keeps alone.
  for (int stage = 0; stage < 2; ++stage) {
    const auto a = sharded.state_bytes[static_cast<size_t>(2 * stage)];
    const auto b = sharded.state_bytes[static_cast<size_t>(2 * stage + 1)];
    EXPECT_EQ(a + b, plain.state_bytes[static_cast<size_t>(2 * stage)]) << "stage " << stage;
    EXPECT_GT(a, 0);
    EXPECT_GT(b, 0);
    EXPECT_LT(std::max(a, b), plain.state_bytes[static_cast<size_t>(2 * stage)] * 3 / 4) << "stage " << stage;
  }
}

TEST(Zero1, FourReplicasOfOneStage) {
  // One stage on four replicas: every replica updates about a quarter.
  const ZeroRun sharded = run(4, zero_config(1, 1, 1), 3);
  const ZeroRun one = run(1, zero_config(1, 0, 4), 3);
  expect_same_run(one, sharded, 1e-5);
}

class Zero1Checkpoint : public CheckpointDirTest {};

TEST_F(Zero1Checkpoint, ResumesUnderAnyLayoutWithOrWithoutZero) {
  const auto ckpt = (dir_ / "ckpt").string();
  // Saved by 2 stages x 2 replicas under ZeRO-1 after 2 of 4 steps.
  const ZeroRun straight = run(4, zero_config(2, 1, 2), 4, 0, "", ckpt, 2);
  ASSERT_TRUE(fs::exists(ckpt + "/layer_00000-optim-0.pt") || fs::exists(ckpt + "/layer_00000-optim-1.pt"));
  ASSERT_FALSE(fs::exists(ckpt + "/layer_00000-optim.pt"));
  ZeroRun tail = straight;
  tail.losses.erase(tail.losses.begin(), tail.losses.begin() + 2);
  struct Layout {
    int ranks, stages, zero, micro_batches;
  };
  for (const Layout l : {Layout{4, 2, 1, 2}, Layout{3, 3, 0, 4}, Layout{4, 1, 1, 1}, Layout{2, 1, 1, 2},
                         Layout{4, 4, 0, 4}}) {
    SCOPED_TRACE(::testing::Message() << l.stages << " stages x " << l.ranks / l.stages << " replicas, ZeRO "
                                      << l.zero);
    const ZeroRun resumed = run(l.ranks, zero_config(l.stages, l.zero, l.micro_batches), 2, 2, ckpt);
    expect_same_run(tail, resumed, 1e-5);
  }
  // Without the moments the resumed run differs, so the comparison above can tell.
  for (const auto& e : fs::directory_iterator(ckpt)) {
    if (e.path().filename().string().find("-optim-") != std::string::npos) fs::remove(e.path());
  }
  {
    std::ifstream in(ckpt + "/manifest.json");
    auto manifest = nlohmann::json::parse(in);
    for (auto& [key, file] : manifest["files"].items()) file.erase("optim_shards");
    std::ofstream(ckpt + "/manifest.json") << manifest.dump();
  }
  const ZeroRun bare = run(2, zero_config(2, 0, 4), 2, 2, ckpt);
  EXPECT_GT(std::abs(bare.losses[1] - tail.losses[1]), 1e-5 * std::abs(tail.losses[1]));
}

TEST_F(Zero1Checkpoint, AZeroFreeCheckpointResumesSharded) {
  const auto ckpt = (dir_ / "ckpt").string();
  const ZeroRun straight = run(4, zero_config(4, 0, 4), 4, 0, "", ckpt, 2);
  ZeroRun tail = straight;
  tail.losses.erase(tail.losses.begin(), tail.losses.begin() + 2);
  const ZeroRun resumed = run(4, zero_config(2, 1, 2), 2, 2, ckpt);
  expect_same_run(tail, resumed, 1e-5);
}

TEST_F(Zero1Checkpoint, OneProcessLoadsTheMergedShards) {
  const auto ckpt = (dir_ / "ckpt").string();
  const ZeroRun straight = run(4, zero_config(2, 1, 2), 3, 0, "", ckpt, 2);
  auto module = mlp(5, 12, 5, 4);
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 1);
  std::vector<torch::Tensor> params;
  for (auto& m : built.modules) {
    for (auto& p : m.ptr()->parameters()) params.push_back(p);
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(0.01));
  EXPECT_EQ(load_checkpoint(built, ckpt, &adam, "Adam"), 2);
  EXPECT_EQ(optimizer_state_bytes(adam), straight.state_bytes[0] + straight.state_bytes[1] +
                                             straight.state_bytes[2] + straight.state_bytes[3]);
}

}  // namespace
}  // namespace pipetrain::testing
