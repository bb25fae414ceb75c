// Batch norm under GPipe, with and without deferred running statistics.
#include <gtest/gtest.h>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"

namespace pipetrain {
namespace {

torch::nn::Sequential bn_model(c10::optional<double> momentum) {
  torch::manual_seed(0);
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
      torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(4).momentum(momentum)),
      torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(4 * 5 * 5, 6),
      torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(6).momentum(momentum)));
}

// One BatchNorm per model: a second one downstream would see inputs normalised per
// micro-batch, which a full-batch run does not, so only the first is comparable.
torch::nn::Sequential single_bn_model(int kind, c10::optional<double> momentum) {
  torch::manual_seed(0);
  if (kind == 2) {
    return torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
        torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(4).momentum(momentum)),
        torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(4 * 5 * 5, 6));
  }
  return torch::nn::Sequential(
      torch::nn::Flatten(), torch::nn::Linear(3 * 5 * 5, 6),
      torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(6).momentum(momentum)),
      torch::nn::Tanh(), torch::nn::Linear(6, 6));
}

std::vector<torch::Tensor> buffers_of(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& b : m.buffers()) out.push_back(b.to(torch::kDouble));
  return out;
}

class DeferredBatchNorm : public ::testing::TestWithParam<c10::optional<double>> {};

TEST_P(DeferredBatchNorm, RunningStatisticsEqualFullBatchBatchNorm) {
 for (int kind : {1, 2}) {
  auto model = single_bn_model(kind, GetParam());
  auto plain = testing::deep_copy(model);
  GPipe gpipe(model, GPipeOptions({3, 2}).chunks(4).deferred_batch_norm(true));
  for (int step = 0; step < 2; ++step) {  // two steps: the cumulative average's 1/n changes
    const torch::Tensor x = torch::randn({16, 3, 5, 5});
    gpipe->forward(x).sum().backward();
    plain->forward(x).sum().backward();
    const auto a = buffers_of(*gpipe);
    const auto b = buffers_of(*plain);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_TRUE(torch::allclose(a[k], b[k], 0, 1e-4))
          << "BatchNorm" << kind << "d step " << step << " buffer " << k << " differs by "
          << (a[k] - b[k]).abs().max().item<double>();
    }
  }
 }
}

INSTANTIATE_TEST_SUITE_P(GPipe, DeferredBatchNorm,
                         ::testing::Values(c10::optional<double>(0.1), c10::nullopt),
                         [](const auto& info) {
                           return info.param ? std::string("momentum") : "cumulative";
                         });

TEST(GPipeBatchNorm, DeferredSharesTheOriginalTensorsAndEvalUsesThem) {
  auto model = bn_model(0.1);
  const torch::Tensor mean_before = model[1]->as<torch::nn::BatchNorm2dImpl>()->running_mean;
  GPipe gpipe(model, GPipeOptions({3, 3}).chunks(2).deferred_batch_norm(true));
  gpipe->forward(torch::randn({8, 3, 5, 5}));
  EXPECT_GT(mean_before.abs().sum().item<double>(), 0) << "the model's own buffer was updated";
  gpipe->eval();
  auto plain = testing::deep_copy(model);
  plain->eval();
  const torch::Tensor x = torch::randn({4, 3, 5, 5});
  EXPECT_TRUE(torch::allclose(gpipe->forward(x), plain->forward(x), 1e-5, 1e-6));
}

TEST(GPipeBatchNorm, DeferredGradientsEqualPerMicroBatchNormalisation) {
  // Each micro-batch is normalised with its own statistics: the oracle is the plain model run
  // on each micro-batch separately.
  auto model = bn_model(0.1);
  auto plain = testing::deep_copy(model);
  // LibTorch's Linear, as the plain model's: a BatchNorm over 4 rows amplifies the last bits
  // of another GEMM's sum order (the fast path's native kernel) past float32's tolerance here;
  // the fast path's own transparency is tested without a BatchNorm after it.
  GPipe gpipe(model, GPipeOptions({2, 4}).chunks(4).deferred_batch_norm(true)
                         .checkpoint(Checkpoint::Always).deferred_linear(false));
  const torch::Tensor x = torch::randn({16, 3, 5, 5});
  const torch::Tensor y = torch::randn({16, 6});
  torch::mse_loss(gpipe->forward(x), y, torch::Reduction::Sum).backward();
  for (int64_t i = 0; i < 4; ++i) {
    torch::mse_loss(plain->forward(x.narrow(0, 4 * i, 4)), y.narrow(0, 4 * i, 4),
                    torch::Reduction::Sum)
        .backward();
  }
  testing::expect_close(testing::grads(*gpipe), testing::grads(*plain), "deferred BN gradients");
}

TEST(GPipeBatchNorm, WithoutDeferralStatisticsFollowEachMicroBatch) {
  // Plain BatchNorm inside GPipe updates its running statistics once per micro-batch (and, when
  // checkpointed, again on recomputation; hence Never here).
  auto model = bn_model(0.1);
  auto plain = testing::deep_copy(model);
  GPipe gpipe(model, GPipeOptions({3, 3}).chunks(4).checkpoint(Checkpoint::Never).deferred_linear(false));
  const torch::Tensor x = torch::randn({16, 3, 5, 5});
  gpipe->forward(x).sum().backward();
  for (int64_t i = 0; i < 4; ++i) plain->forward(x.narrow(0, 4 * i, 4)).sum().backward();
  const auto a = buffers_of(*gpipe);
  const auto b = buffers_of(*plain);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(torch::allclose(a[k], b[k], 0, 1e-5)) << k;
  testing::expect_close(testing::grads(*gpipe), testing::grads(*plain), "plain BN gradients");
}

}  // namespace
}  // namespace pipetrain
