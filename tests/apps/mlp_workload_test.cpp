// The "mlp" workload: WORKLOADS.md's check values, and its first-step loss through the example.
#include "apps/data/mlp_workload.h"

#include <gtest/gtest.h>

#include "apps/examples/example.h"
#include "apps/examples/reference_trainer.h"

namespace pipetrain::data {
namespace {

TEST(MlpWorkload, CheckValuesOfWorkloadsMd) {
  const MlpWorkload& w = mlp_workload();
  ASSERT_EQ(w.weights.size(), 16u);
  EXPECT_NEAR(w.weights[0].sum().item<double>(), 14.062727, 1e-4);
  EXPECT_NEAR(w.biases[0].sum().item<double>(), -0.772785, 1e-5);
  EXPECT_NEAR(w.weights[15].sum().item<double>(), -7.232272, 1e-4);
  EXPECT_NEAR(w.x.sum().item<double>(), 684.116211, 1e-3);
  EXPECT_NEAR(w.y.sum().item<double>(), -253.066254, 1e-3);
  const auto x0 = w.x[0].slice(0, 0, 3);
  EXPECT_NEAR(x0[0].item<double>(), -0.49690342, 1e-7);
  EXPECT_NEAR(x0[1].item<double>(), 0.60149366, 1e-7);
  EXPECT_NEAR(x0[2].item<double>(), 0.73933721, 1e-7);
  EXPECT_LE(w.weights[3].abs().max().item<double>(), 1.0 / 32);
}

TEST(MlpWorkload, LeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(99);
  const auto expected = torch::rand({4});
  torch::manual_seed(99);
  (void)mlp_workload();
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(MlpWorkload, FirstStepLossThroughTheExample) {
  torch::set_num_threads(1);
  const auto ex = examples::make_example("mlp");
  ASSERT_EQ(ex.layers.size(), 32u);
  // The 8 micro-batches are the 32-row slices of x in order.
  const auto mb = ex.train_micro_batch(0, 0, 3);
  EXPECT_TRUE(torch::equal(mb.inputs.tensor(), mlp_workload().x.slice(0, 96, 128)));
  const auto result = examples::train_reference(
      ex, ex.engine_config(), examples::ReferenceOptions().steps(2).evaluate(false));
  EXPECT_NEAR(result.losses[0], 0.99567413, 2e-6);
  // WORKLOADS.md: the loss moves by about 1.8e-7 per step, near float resolution.
  EXPECT_NEAR(result.losses[1], result.losses[0], 1e-6);
}

}  // namespace
}  // namespace pipetrain::data
