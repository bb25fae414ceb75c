// 3D parallelism in the engine: stages x replicas x tensor-parallel ranks (threads of this
// process) against the same model in one process, losses at every step and every parameter
// after training (read back through a checkpoint, which holds full tensors); checkpoints
// written under one grid, with Adam state and ZeRO-1, resume under others.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "engine/checkpoint_support.h"
#include "engine/engine_models.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/error.h"
#include "pipetrain/runtime/dropout.h"
#include "pipetrain/runtime/parallel_layers.h"

namespace pipetrain::testing {
namespace {

namespace fs = std::filesystem;
namespace nn = torch::nn;

// x + drop(W2 drop'(gelu(W1 x + b1)) + b2): W1 column-parallel, W2 row-parallel under a
// tensor-parallel group (the split of a transformer's MLP), the plain layers without one. drop'
// sees only this rank's columns (a sharded region); drop sees the replicated sum.
struct TpMlpImpl : nn::Module {
  TpMlpImpl(int64_t width, double dropout) {
    nn::Linear up(width, 4 * width), down(4 * width, width);
    const auto& tp = runtime::current_tensor_parallel();
    fc = tp.active() ? nn::AnyModule(runtime::ColumnParallelLinear(up, tp)) : nn::AnyModule(up);
    out = tp.active() ? nn::AnyModule(runtime::RowParallelLinear(down, tp)) : nn::AnyModule(down);
    register_module("fc", fc.ptr());
    register_module("out", out.ptr());
    sharded_drop = register_module("sharded_drop", runtime::Dropout(dropout));
    drop = register_module("drop", runtime::Dropout(dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::gelu(fc.forward(x));
    {
      runtime::ShardedRandomScope sharded;
      h = sharded_drop(h);
    }
    return x + drop(out.forward(h));
  }
  nn::AnyModule fc, out;
  runtime::Dropout sharded_drop{nullptr}, drop{nullptr};
};
TORCH_MODULE(TpMlp);

// Linear(5, 8), then `blocks` tensor-parallel MLP blocks, then Linear(8, 5): plain layers are
// replicated across a tensor-parallel group.
PipelineModule tp_model(int blocks, double dropout = 0.0) {
  PipelineModule m;
  m.layers.push_back(LayerSpec::of<nn::Linear>("Linear", 5, 8));
  for (int i = 0; i < blocks; ++i) {
    m.layers.push_back(
        LayerSpec::make("TpMlp", "TpMlp", [dropout] { return nn::AnyModule(TpMlp(8, dropout)); }));
  }
  m.layers.push_back(LayerSpec::of<nn::Linear>("Linear", 8, 5));
  m.loss = mse;
  return m;
}

EngineConfig grid_config(int stages, int tensor, int micro_batches, int zero = 0) {
  auto c = ckpt_config(stages);
  c.optimizer.type = "Adam";
  c.optimizer.lr = 0.01;
  c.gradient_clipping = 0.3;  // the global norm must be the whole model's
  c.gradient_accumulation_steps = micro_batches;
  c.tensor_parallel.size = tensor;
  c.zero_optimization.stage = zero;
  return c;
}

struct GridRun {
  std::vector<double> losses;
  std::vector<int64_t> bytes_read;  // micro-batches each rank pulled from its iterator
  // Each rank's replicated parameters (not tensor-parallel slices) after the run, in order.
  std::vector<std::vector<torch::Tensor>> replicated;
};

// Steps [first, first + steps) on `ranks` threads; the global batch of a step is 4 micro-batches
// whatever the grid. Loads `load` first and saves into `save` at the end when given.
GridRun run_grid(int ranks, const EngineConfig& config, int steps, int64_t first = 0, const std::string& load = "",
                 const std::string& save = "", double dropout = 0.0) {
  GridRun out;
  out.bytes_read.assign(static_cast<size_t>(ranks), 0);
  out.replicated.resize(static_cast<size_t>(ranks));
  std::mutex mutex;
  run_pipeline(ranks, config, [dropout] { return tp_model(3, dropout); }, [&](PipelineEngine& engine) {
    if (!load.empty()) {
      EXPECT_EQ(load_checkpoint(engine, load), first);
    }
    std::vector<double> losses;
    int64_t pulled = 0;
    for (int64_t s = first; s < first + steps; ++s) {
      int i = 0;
      FunctionIterator it([&]() -> std::optional<MicroBatch> {
        if (i >= engine.micro_batches()) return std::nullopt;
        ++pulled;
        return mlp_batch(s, 0, engine.replica() * engine.micro_batches() + i++, 4, 5, 5);
      });
      losses.push_back(engine.train_batch(it));
    }
    if (!save.empty()) save_checkpoint(engine, save);
    std::lock_guard<std::mutex> lock(mutex);
    const auto rank = static_cast<size_t>(engine.communicator().rank());
    out.bytes_read[rank] = pulled;
    for (const auto& [index, module] : engine.local_layers()) {
      for (const auto& p : module.ptr()->parameters()) {
        if (!runtime::shard_layout(p)) out.replicated[rank].push_back(p.detach().clone());
      }
    }
    if (rank == 0) out.losses = losses;
  });
  return out;
}

// Every parameter of the model a checkpoint holds, by "<layer>.<name>".
std::map<std::string, torch::Tensor> checkpoint_params(const std::string& dir) {
  auto module = tp_model(3);
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 1);
  load_checkpoint(built, dir);
  std::map<std::string, torch::Tensor> out;
  for (size_t i = 0; i < built.modules.size(); ++i) {
    for (const auto& p : built.modules[i].ptr()->named_parameters()) out[std::to_string(i) + "." + p.key()] = p.value();
  }
  return out;
}

class TensorParallelEngine : public CheckpointDirTest {};

TEST_F(TensorParallelEngine, EveryGridTrainsTheOneProcessModel) {
  const auto oracle_dir = (dir_ / "oracle").string();
  const GridRun oracle = run_grid(1, grid_config(1, 1, 4), 4, 0, "", oracle_dir);
  EXPECT_LT(oracle.losses[3], oracle.losses[0]);
  const auto expected = checkpoint_params(oracle_dir);
  struct Grid {
    int stages, replicas, tensor, zero;
  };
  for (const Grid g : {Grid{1, 1, 2, 0}, Grid{2, 1, 2, 0}, Grid{1, 1, 4, 0}, Grid{2, 2, 2, 1}, Grid{1, 2, 2, 1}}) {
    SCOPED_TRACE(::testing::Message() << g.stages << " stages x " << g.replicas << " replicas x " << g.tensor
                                      << " tensor, ZeRO " << g.zero);
    const auto dir = (dir_ / "grid").string();
    const int ranks = g.stages * g.replicas * g.tensor;
    const GridRun run = run_grid(ranks, grid_config(g.stages, g.tensor, 4 / g.replicas, g.zero), 4, 0, "", dir);
    ASSERT_EQ(run.losses.size(), oracle.losses.size());
    for (size_t i = 0; i < run.losses.size(); ++i) {
      EXPECT_NEAR(run.losses[i], oracle.losses[i], 1e-5 * std::abs(oracle.losses[i])) << "step " << i;
    }
    const auto got = checkpoint_params(dir);
    ASSERT_EQ(got.size(), expected.size());
    for (const auto& [name, p] : expected) {
      EXPECT_TRUE(torch::allclose(got.at(name), p, 1e-4, 1e-5)) << name;
    }
    // Only the first rank of each tensor-parallel group reads micro-batches (the others get
    // them by broadcast); ranks are (stage, replica, tensor) with tensor innermost.
    for (int r = 0; r < ranks; ++r) {
      if (r % g.tensor != 0) {
        EXPECT_EQ(run.bytes_read[static_cast<size_t>(r)], 0) << "rank " << r;
      }
    }
    EXPECT_GT(run.bytes_read[0], 0);
    fs::remove_all(dir);
  }
}

TEST_F(TensorParallelEngine, ACheckpointResumesUnderAnyGrid) {
  // Written by 2 stages x 2 replicas x 2 tensor-parallel with ZeRO-1 after 2 steps.
  const auto ckpt = (dir_ / "ckpt").string();
  const GridRun head = run_grid(8, grid_config(2, 2, 2, 1), 2, 0, "", ckpt);
  const GridRun straight = run_grid(1, grid_config(1, 1, 4), 4);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(head.losses[i], straight.losses[i], 1e-5 * straight.losses[i]);
  struct Grid {
    int stages, replicas, tensor, zero;
  };
  for (const Grid g : {Grid{1, 1, 1, 0}, Grid{2, 2, 2, 1}, Grid{1, 1, 4, 0}, Grid{2, 2, 1, 1}, Grid{3, 1, 1, 0}}) {
    SCOPED_TRACE(::testing::Message() << g.stages << " stages x " << g.replicas << " replicas x " << g.tensor
                                      << " tensor, ZeRO " << g.zero);
    const GridRun tail = run_grid(g.stages * g.replicas * g.tensor,
                                  grid_config(g.stages, g.tensor, 4 / g.replicas, g.zero), 2, 2, ckpt);
    ASSERT_EQ(tail.losses.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_NEAR(tail.losses[i], straight.losses[i + 2], 1e-5 * straight.losses[i + 2]) << "step " << i + 2;
    }
  }
}

TEST_F(TensorParallelEngine, ShardedDropoutDrawsPerRankAndIsReplayed) {
  // 2 stages x 2 tensor-parallel ranks, dropout 0.3 in a sharded and in a replicated region.
  const auto config = grid_config(2, 2, 4);
  const GridRun run = run_grid(4, config, 3, 0, "", "", 0.3);
  const GridRun without = run_grid(4, config, 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_GT(std::abs(run.losses[i] - without.losses[i]), 1e-4) << "step " << i;
  // The replicated parameters stay equal on the two ranks of each group: both drew the same
  // replicated masks, whatever each drew in its sharded region.
  for (size_t group : {0u, 2u}) {
    ASSERT_EQ(run.replicated[group].size(), run.replicated[group + 1].size());
    ASSERT_FALSE(run.replicated[group].empty());
    for (size_t k = 0; k < run.replicated[group].size(); ++k) {
      EXPECT_TRUE(run.replicated[group][k].equal(run.replicated[group + 1][k])) << "rank " << group << " param " << k;
    }
  }
  // Activation checkpoints recompute each block from the sharded stream as it was at forward.
  auto checkpointed = config;
  checkpointed.pipeline.activation_checkpoint_interval = 1;
  const GridRun recomputed = run_grid(4, checkpointed, 3, 0, "", "", 0.3);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(recomputed.losses[i], run.losses[i], 1e-6 * run.losses[i]) << i;
  // A checkpoint carries both streams: a resume under the same grid draws what the run would.
  // (After the recomputing run: its tensor-parallel collectives, which suspend the leases of the
  // default generator mid-recomputation, must have left the process's generator as it was.)
  const auto ckpt = (dir_ / "ckpt").string();
  run_grid(4, config, 2, 0, "", ckpt, 0.3);
  const GridRun tail = run_grid(4, config, 1, 2, ckpt, "", 0.3);
  EXPECT_NEAR(tail.losses[0], run.losses[2], 1e-6 * run.losses[2]);
}

TEST(TensorParallelTransfer, ActivationsCrossStagesInPartsOfOneTth) {
  // Stage 0 of 2 sends each activation whole without tensor parallelism; with T ranks each
  // sends a 1/T part (plus a small header) and the next stage's group assembles it: the same
  // run, 1/T of the bytes per rank.
  auto sent_by_rank0 = [](int tensor) {
    int64_t bytes = 0;
    double loss = 0;
    std::mutex mutex;
    run_pipeline(2 * tensor, grid_config(2, tensor, 4), [] { return tp_model(2); }, [&](PipelineEngine& engine) {
      int i = 0;
      FunctionIterator it([&]() -> std::optional<MicroBatch> {
        if (i >= engine.micro_batches()) return std::nullopt;
        return mlp_batch(0, 0, i++, 64, 5, 5);
      });
      const double l = engine.train_batch(it);
      std::lock_guard<std::mutex> lock(mutex);
      if (engine.communicator().rank() == 0) {
        bytes = engine.last_step().bytes_sent;
        loss = l;
      }
    });
    return std::make_pair(bytes, loss);
  };
  const auto [whole, loss1] = sent_by_rank0(1);
  const auto [part, loss2] = sent_by_rank0(2);
  EXPECT_EQ(whole, 4 * 64 * 8 * 4);  // 4 activations of 64 x 8 float32
  EXPECT_GT(part, whole / 2);
  EXPECT_LT(part, whole / 2 + 4 * 64);  // + a header of a few int64 per message
  EXPECT_NEAR(loss1, loss2, 1e-5 * loss1);
}

TEST(TensorParallelConfig, TheWorldMustFactorAndTheLayersMustSplit) {
  // 3 ranks cannot hold 1 stage x 2 tensor-parallel ranks per replica.
  auto hub = comm::InProcessHub::create(3);
  std::shared_ptr<comm::Communicator> c = hub->endpoint(0);
  try {
    PipelineEngine engine(tp_model(1), grid_config(1, 2, 4), c);
    FAIL() << "a world of 3 was accepted for tensor-parallel size 2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 3 is not a multiple of the 1 stages x 2 tensor-parallel"),
              std::string::npos)
        << e.what();
  }
  // A Linear of 8 outputs cannot give 16 ranks a row each (refused before any communication).
  EXPECT_THROW(runtime::ColumnParallelLinear(nn::Linear(4, 8), runtime::TensorParallelGroup{nullptr, 0, 16, {}}),
               ConfigError);
}

}  // namespace
}  // namespace pipetrain::testing
