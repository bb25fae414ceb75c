// A stage's model chunk: weight-gradient groups that pause and resume give exactly the
// gradients of the same groups run without pausing.
#include "pipetrain/runtime/stage_model.h"

#include <gtest/gtest.h>

namespace pipetrain::runtime {
namespace {

// Three Linear layers with ReLUs, seeded, as a chunk with the fast Linear path.
StageModel make_chunk() {
  std::vector<LayerSpec> specs{LayerSpec::of<torch::nn::Linear>("Linear", 8, 12), LayerSpec::of<torch::nn::ReLU>("ReLU"),
                               LayerSpec::of<torch::nn::Linear>("Linear", 12, 12), LayerSpec::of<torch::nn::ReLU>("ReLU"),
                               LayerSpec::of<torch::nn::Linear>("Linear", 12, 5)};
  torch::manual_seed(11);
  StageModelOptions options;
  options.gemm_kernel = GemmKernel::Blas;
  return StageModel(build_layers(specs, 0, static_cast<int64_t>(specs.size())), options);
}

// Forward and input-gradient backward of 4 micro-batches; weight gradients left pending.
void run_micro_batches(StageModel& chunk) {
  torch::manual_seed(12);
  for (int64_t mb = 0; mb < 4; ++mb) {
    auto x = torch::randn({3, 8}, torch::requires_grad());
    chunk.forward(Batch(x), mb).tensor().square().sum().backward();
  }
}

std::vector<torch::Tensor> grads(const StageModel& chunk) {
  std::vector<torch::Tensor> out;
  for (const auto& p : chunk.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

// Bit for bit: a pause must not change the result (a resumed run must repeat the original).
void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
}

TEST(StageModel, PausedWeightGroupsRunWithTheNextGroup) {
  auto fused = make_chunk();
  run_micro_batches(fused);
  ASSERT_EQ(fused.num_deferred_linear(), 3);
  fused.backward_weight({0, 1});
  fused.backward_weight({2, 3});

  for (int pause_at : {0, 1, 2}) {
    SCOPED_TRACE("paused before layer " + std::to_string(pause_at));
    auto chunk = make_chunk();
    run_micro_batches(chunk);
    int checks = 0;
    EXPECT_TRUE(chunk.backward_weight_group({0, 1}, [&] { return checks++ == pause_at; }));
    // With a paused group pending the next one does not pause: it finishes both.
    EXPECT_FALSE(chunk.backward_weight_group({2, 3}, [] { return true; }));
    expect_same(grads(chunk), grads(fused));
  }
}

TEST(StageModel, APausedGroupFinishesBeforeTheStep) {
  auto fused = make_chunk();
  run_micro_batches(fused);
  fused.backward_weight({0, 1});
  fused.backward_weight({2, 3});

  auto chunk = make_chunk();
  run_micro_batches(chunk);
  EXPECT_FALSE(chunk.backward_weight_group({0, 1}, {}));
  int checks = 0;
  EXPECT_TRUE(chunk.backward_weight_group({2, 3}, [&] { return checks++ == 1; }));
  chunk.finish_weight_groups();
  chunk.finish_weight_groups();  // nothing left: a no-op
  expect_same(grads(chunk), grads(fused));
}

}  // namespace
}  // namespace pipetrain::runtime
