// On a CUDA machine (skipped elsewhere): an nn::Dropout nested in a custom block (GPipe replaces
// only top-level ones) draws from the GPU's own generator; recomputation under checkpointing
// must draw the same masks, so checkpoint always and never give equal losses and gradients.
// Two partitions share cuda:0, so their draws must not depend on which task runs first.
// scripts/gpu-check.sh runs it (filter Cuda*).
#include <gtest/gtest.h>

#include "pipetrain/engine/gpipe.h"

namespace pipetrain::testing {
namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out)
      : linear(register_module("linear", torch::nn::Linear(in, out))),
        dropout(register_module("dropout", torch::nn::Dropout(0.5))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    // Functional dropout too: torch::dropout draws from the same default generator.
    return torch::dropout(dropout(torch::relu(linear(x))), 0.25, is_training());
  }
  torch::nn::Linear linear;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Block);

class CudaNestedDropout : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  }
};

TEST_F(CudaNestedDropout, CheckpointAlwaysEqualsNeverOnOneGpu) {
  const std::vector<torch::Device> devices{torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 0)};
  auto run = [&](Checkpoint mode) {
    torch::manual_seed(0);
    torch::nn::Sequential model(Block(16, 64), Block(64, 64), Block(64, 64), torch::nn::Linear(64, 4));
    GPipe gpipe(model, GPipeOptions({2, 2}).chunks(4).devices(devices).checkpoint(mode));
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
  // And a second run of the same mode draws the same (no dependence on task order).
  const auto again = run(Checkpoint::Always);
  EXPECT_NEAR(again.first, recomputed.first, 1e-6 * std::abs(recomputed.first));
}

}  // namespace
}  // namespace pipetrain::testing
