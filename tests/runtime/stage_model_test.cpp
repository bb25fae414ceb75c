// A stage's model chunk: weight gradients run in pieces, paused, resumed and used to fill
// waits give exactly the bits of one uninterrupted product (native kernel); on other kernels
// groups run in full, as grouped.
#include "pipetrain/runtime/stage_model.h"

#include <gtest/gtest.h>

#include <random>

namespace pipetrain::runtime {
namespace {

// Linear layers whose widths leave partial row blocks (300 = 128 + 128 + 44) and partial
// 32-column panels (40, 260), with ReLUs, seeded.
StageModel make_chunk(GemmKernel kernel) {
  std::vector<LayerSpec> specs{LayerSpec::of<torch::nn::Linear>("Linear", 40, 300), LayerSpec::of<torch::nn::ReLU>("ReLU"),
                               LayerSpec::of<torch::nn::Linear>("Linear", 300, 260), LayerSpec::of<torch::nn::ReLU>("ReLU"),
                               LayerSpec::of<torch::nn::Linear>("Linear", 260, 5)};
  torch::manual_seed(11);
  StageModelOptions options;
  options.gemm_kernel = kernel;
  return StageModel(build_layers(specs, 0, static_cast<int64_t>(specs.size())), options);
}

// Forward and input-gradient backward of micro-batch `mb` (uneven rows); its weight gradient pending.
void run_micro_batch(StageModel& chunk, int64_t mb) {
  const int64_t rows[] = {3, 33, 7, 1};
  torch::manual_seed(12 + mb);
  auto x = torch::randn({rows[mb], 40}, torch::requires_grad());
  chunk.forward(Batch(x), mb).tensor().square().sum().backward();
}

void run_micro_batches(StageModel& chunk) {
  for (int64_t mb = 0; mb < 4; ++mb) run_micro_batch(chunk, mb);
}

std::vector<torch::Tensor> grads(const StageModel& chunk) {
  std::vector<torch::Tensor> out;
  for (const auto& p : chunk.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

// Bit for bit: how the work was cut must not change the result (a resumed run must repeat the original).
void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i << ": max difference "
                                          << (a[i] - b[i]).abs().max().item<float>();
  }
}

class NativeStageModel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!native_gemm_available()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 and FMA";
  }
};

TEST_F(NativeStageModel, PiecesPausesAndFillsGiveTheBitsOfOneProduct) {
  auto whole = make_chunk(GemmKernel::Native);
  run_micro_batches(whole);
  ASSERT_EQ(whole.num_deferred_linear(), 3);
  whole.backward_weight({0, 1, 2, 3});
  const auto expected = grads(whole);

  std::mt19937 rng(5);
  for (int trial = 0; trial < 12; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    auto chunk = make_chunk(GemmKernel::Native);
    // Random fills between the backwards and random pauses in the groups, as a stage's timing
    // would make them: the pieces take in different runs of micro-batches every trial.
    auto coin = [&] { return std::uniform_int_distribution<int>(0, 2)(rng) == 0; };
    auto fills = [&] {
      for (int f = std::uniform_int_distribution<int>(0, 4)(rng); f > 0; --f) chunk.fill_weight_gradients();
    };
    run_micro_batch(chunk, 0);
    fills();
    run_micro_batch(chunk, 1);
    chunk.backward_weight_group({0, 1}, coin);
    fills();
    run_micro_batch(chunk, 2);
    fills();
    run_micro_batch(chunk, 3);
    chunk.backward_weight_group({2, 3}, coin);
    fills();
    chunk.finish_weight_groups();
    EXPECT_FALSE(chunk.fill_weight_gradients()) << "nothing is left after finish_weight_groups";
    expect_same(grads(chunk), expected);
  }
}

TEST_F(NativeStageModel, AGroupThatFindsItsMessageWaitingDoesNothingYet) {
  auto chunk = make_chunk(GemmKernel::Native);
  run_micro_batches(chunk);
  EXPECT_TRUE(chunk.backward_weight_group({0, 1, 2, 3}, [] { return true; }));
  for (const auto& p : chunk.parameters()) EXPECT_FALSE(p.grad().defined());
  chunk.finish_weight_groups();
  for (const auto& p : chunk.parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST_F(NativeStageModel, AGroupStopsAtItsOwnMicroBatches) {
  auto whole = make_chunk(GemmKernel::Native);
  run_micro_batches(whole);
  whole.backward_weight({0, 1, 2, 3});
  const auto expected = grads(whole);

  // All four input gradients ran; a group for micro-batch 1 takes in 0 and 1 (the order they
  // ran), and leaves 2 and 3 for the waits that follow.
  auto chunk = make_chunk(GemmKernel::Native);
  run_micro_batches(chunk);
  EXPECT_FALSE(chunk.backward_weight_group({1}, [] { return false; }));
  int pieces = 0;
  while (chunk.fill_weight_gradients()) ++pieces;
  // Three layers of 3, 3 and 1 row blocks, two micro-batches a piece: one piece each.
  EXPECT_EQ(pieces, 7) << "the group ran beyond its micro-batches or left some of them";
  expect_same(grads(chunk), expected);
}

TEST(StageModel, OtherKernelsRunGroupsInFull) {
  auto grouped = make_chunk(GemmKernel::Blas);
  run_micro_batches(grouped);
  grouped.backward_weight({0, 1});
  grouped.backward_weight({2, 3});

  auto chunk = make_chunk(GemmKernel::Blas);
  run_micro_batches(chunk);
  EXPECT_FALSE(chunk.backward_weight_group({0, 1}, [] { return true; }));
  EXPECT_FALSE(chunk.fill_weight_gradients()) << "no pieces to fill a wait with";
  EXPECT_FALSE(chunk.backward_weight_group({2, 3}, [] { return true; }));
  chunk.finish_weight_groups();  // nothing left: a no-op
  expect_same(grads(chunk), grads(grouped));
}

}  // namespace
}  // namespace pipetrain::runtime
