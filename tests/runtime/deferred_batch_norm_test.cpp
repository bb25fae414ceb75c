// Deferred batch norm on its own: statistics once per commit, equal to a full-batch BatchNorm.
#include "pipetrain/runtime/deferred_batch_norm.h"

#include <gtest/gtest.h>

#include "pipetrain/runtime/checkpoint.h"

namespace pipetrain::runtime {
namespace {

TEST(DeferredBatchNorm, CommitEqualsFullBatchBatchNorm) {
  torch::manual_seed(0);
  torch::nn::BatchNorm2d bn(torch::nn::BatchNormOptions(3).momentum(0.2));
  DeferredBatchNorm deferred(torch::nn::BatchNormOptions(3).momentum(0.2));
  const torch::Tensor x = torch::randn({12, 3, 4, 4}) * 3 + 1;
  bn(x);
  for (const auto& part : x.chunk(3)) deferred(part);
  EXPECT_EQ(deferred->tracked(), 3);
  EXPECT_TRUE(torch::equal(deferred->running_mean, torch::zeros({3})));  // not yet
  deferred->commit();
  EXPECT_EQ(deferred->tracked(), 0);
  EXPECT_TRUE(torch::allclose(deferred->running_mean, bn->running_mean, 0, 1e-5));
  EXPECT_TRUE(torch::allclose(deferred->running_var, bn->running_var, 0, 1e-5));
  EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 1);
}

TEST(DeferredBatchNorm, NormalisesEachMicroBatchWithItsOwnStatistics) {
  torch::nn::BatchNorm1d bn(4);
  DeferredBatchNorm deferred(torch::nn::BatchNormOptions(4));
  const torch::Tensor x = torch::randn({6, 4});
  EXPECT_TRUE(torch::allclose(deferred(x.narrow(0, 0, 3)), bn(x.narrow(0, 0, 3)), 1e-5, 1e-6));
}

TEST(DeferredBatchNorm, RecomputationIsNotCountedTwice) {
  DeferredBatchNorm deferred(torch::nn::BatchNormOptions(2));
  torch::Tensor x = torch::randn({4, 2}, torch::requires_grad());
  auto out = checkpointed_forward([&](const Tensors& in) { return Tensors{deferred(in[0])}; }, {x});
  out[0].pow(2).sum().backward();
  EXPECT_EQ(deferred->tracked(), 1);
}

TEST(DeferredBatchNorm, ConversionSharesTensorsAndSkipsUntrackedOnes) {
  torch::nn::BatchNorm2d tracked(3);
  torch::nn::BatchNorm2d untracked(torch::nn::BatchNormOptions(3).track_running_stats(false));
  torch::nn::Sequential model(tracked, torch::nn::BatchNorm1d(2), untracked);
  auto converted = convert_deferred_batch_norm(model);
  auto d = converted[0]->as<DeferredBatchNormImpl>();
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->weight.is_same(tracked->weight));
  EXPECT_TRUE(d->running_var.is_same(tracked->running_var));
  EXPECT_NE(converted[1]->as<DeferredBatchNormImpl>(), nullptr);
  EXPECT_EQ(converted[2].get(), untracked.ptr().get());
  EXPECT_EQ(deferred_batch_norms(*converted).size(), 2u);
}

}  // namespace
}  // namespace pipetrain::runtime
