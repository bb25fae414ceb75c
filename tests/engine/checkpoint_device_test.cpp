// Checkpoints load onto the device of the module they load into (map_location), not the device
// that saved them: the choice on the CPU, and (CUDA only, skipped elsewhere) a checkpoint saved
// by an engine on cuda:0 loaded into a CPU model, which must stay on the CPU.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "engine/checkpoint_device.h"
#include "engine/checkpoint_support.h"
#include "engine/engine_models.h"
#include "engine/engine_oracle.h"
#include "pipetrain/engine/layer_checkpoint.h"

namespace pipetrain::testing {
namespace {

// A module whose tensors sit on meta (no storage, any machine has it), as a parameter or a
// buffer: a stand-in for a module on a device other than the CPU.
struct OnMeta : torch::nn::Module {
  explicit OnMeta(bool as_parameter) {
    auto t = torch::zeros({2, 2}, torch::TensorOptions().device(c10::kMeta));
    if (as_parameter) {
      register_parameter("weight", t);
    } else {
      register_buffer("mask", t);
    }
  }
};

TEST(CheckpointLoadDevice, IsTheDeviceOfTheModulesOwnTensors) {
  torch::nn::Linear cpu(3, 2);
  EXPECT_EQ(detail::checkpoint_load_device(*cpu), c10::Device(c10::kCPU));
  EXPECT_EQ(detail::checkpoint_load_device(OnMeta(true)), c10::Device(c10::kMeta));
  // Buffers decide when there are no parameters; nothing at all means the CPU.
  EXPECT_EQ(detail::checkpoint_load_device(OnMeta(false)), c10::Device(c10::kMeta));
  torch::nn::Module nested;
  nested.register_module("relu", torch::nn::ReLU());
  nested.register_module("inner", std::make_shared<OnMeta>(true));
  EXPECT_EQ(detail::checkpoint_load_device(nested), c10::Device(c10::kMeta));
  torch::nn::ReLU relu;
  EXPECT_EQ(detail::checkpoint_load_device(*relu), c10::Device(c10::kCPU));
}

class CudaCheckpoint : public CheckpointDirTest {
 protected:
  void SetUp() override {
    CheckpointDirTest::SetUp();
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  }
};

// pipetrain train --example gpt loads the GPU run's checkpoint into a CPU model for its sample;
// before, the tensors came back on cuda:0 and moved the CPU model's parameters there.
TEST_F(CudaCheckpoint, SavedOnCudaLoadsIntoACpuModuleThatStaysOnTheCpu) {
  auto make = [] { return tied_mlp(5, 12, 3); };
  const auto ckpt = (dir_ / "ckpt").string();
  std::map<std::string, torch::Tensor> saved;
  std::mutex mutex;
  auto config = ckpt_config(1);
  config.pipeline.device = "cuda:0";
  run_pipeline(1, config, make, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    save_checkpoint(engine, ckpt);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, p] : engine.named_parameters()) {
      EXPECT_TRUE(p.is_cuda()) << name;
      saved[name] = p.detach().cpu();
    }
  });
  auto module = make();
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 5);
  EXPECT_EQ(load_checkpoint(built, ckpt), 2);
  const auto all = named_by_first_use(built);
  ASSERT_FALSE(all.empty());
  for (const auto& [name, p] : all) {
    EXPECT_TRUE(p.device().is_cpu()) << name << " is on " << p.device();
    if (saved.count(name)) {
      EXPECT_TRUE(torch::equal(p, saved.at(name))) << name;
    }
  }
}

}  // namespace
}  // namespace pipetrain::testing
