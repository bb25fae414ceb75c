// On a CUDA machine (skipped elsewhere): GPipe and the engine on GPUs give the CPU's results,
// and the device statistics fill in. scripts/gpu-check.sh runs these.
#include <gtest/gtest.h>

#include "engine/engine_models.h"
#include "engine/engine_oracle.h"
#include "engine/gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/runtime/device.h"

namespace pipetrain::testing {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  }
};

torch::nn::Sequential small_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                               torch::nn::ReLU(), torch::nn::Linear(32, 4));
}

TEST_F(Cuda, GPipeOnGpusEqualsTheCpuModel) {
  const int64_t n = std::min<int64_t>(2, torch::cuda::device_count());
  std::vector<torch::Device> devices;
  for (int64_t j = 0; j < 2; ++j) devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(j % n));
  auto plain = small_mlp();
  auto model = small_mlp();  // same seed, same weights
  GPipe gpipe(model, GPipeOptions({3, 2}).chunks(4).devices(devices).checkpoint(Checkpoint::Always));
  const auto x = torch::randn({32, 16});
  const auto y = torch::randn({32, 4});
  const auto loss = torch::mse_loss(gpipe->forward(x.to(devices[0])), y.to(devices[1]));
  loss.backward();
  const auto plain_loss = torch::mse_loss(plain->forward(x), y);
  plain_loss.backward();
  EXPECT_NEAR(loss.item<double>(), plain_loss.item<double>(), 1e-4 * std::abs(plain_loss.item<double>()));
  const auto a = gpipe->parameters(), b = plain->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(a[k].is_cuda());
    EXPECT_TRUE(torch::allclose(a[k].grad().cpu(), b[k].grad(), 1e-4, 1e-5)) << k;
  }
  const auto peak = runtime::peak_device_memory_bytes(devices[0]);
  ASSERT_TRUE(peak.has_value());
  EXPECT_GT(*peak, 0);
}

// GPipe converts nn::Dropout to runtime::Dropout, whose mask a CPU generator cannot draw on a
// GPU: it comes from a CUDA generator the task stream seeds, so recomputation under checkpointing
// draws the same masks and the gradients equal those of the run that kept its activations.
TEST_F(Cuda, GPipeDropoutOnTheGpuRecomputesTheSameMasks) {
  const std::vector<torch::Device> devices{torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 0)};
  auto run = [&](Checkpoint mode) {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Dropout(0.5),
                                torch::nn::Linear(64, 64), torch::nn::Dropout(0.5), torch::nn::Linear(64, 4));
    GPipe gpipe(model, GPipeOptions({3, 3}).chunks(4).devices(devices).checkpoint(mode));
    torch::manual_seed(7);
    const auto x = torch::randn({32, 16}).to(devices[0]);
    const auto y = torch::randn({32, 4}).to(devices[1]);
    const auto loss = torch::mse_loss(gpipe->forward(x), y);
    loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : gpipe->parameters()) grads.push_back(p.grad().cpu());
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto kept = run(Checkpoint::Never);
  const auto recomputed = run(Checkpoint::Always);
  EXPECT_NEAR(kept.first, recomputed.first, 1e-6 * std::abs(kept.first));
  ASSERT_EQ(kept.second.size(), recomputed.second.size());
  for (size_t k = 0; k < kept.second.size(); ++k) {
    EXPECT_TRUE(torch::allclose(kept.second[k], recomputed.second[k], 1e-5, 1e-6)) << k;
  }
}

TEST_F(Cuda, EngineOnTheGpuMatchesOneCpuProcess) {
  OracleCase c;
  c.module = [] { return mlp(6, 16, 3, 4); };
  c.config = oracle_config(4, "1f1b");
  c.config.pipeline.device = "cuda";
  c.stages = 2;
  c.data = [](int64_t s, int r, int m) { return mlp_batch(s, r, m, 4, 6, 3); };
  OracleRun pipelined;
  expect_same_training(c, 1e-4, 1e-5, &pipelined);
  for (const auto& [name, p] : pipelined.params) EXPECT_TRUE(p.is_cuda()) << name;
}

}  // namespace
}  // namespace pipetrain::testing
