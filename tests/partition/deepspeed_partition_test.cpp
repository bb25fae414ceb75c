// DeepSpeed's partitioners against tables made by running DeepSpeed's own partition_balanced and
// partition_uniform (deepspeed/runtime/utils.py, 0.12.5 and later) on the same weights.
#include "pipetrain/partition/deepspeed_partition.h"

#include <gtest/gtest.h>

#include <limits>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

struct Case {
  std::vector<double> weights;
  int64_t parts;
  std::vector<int64_t> balance;  // DeepSpeed's parts, as layers per stage
};

// The trainable-parameter counts of DeepSpeedExamples' CIFAR AlexNet layer list (features,
// the flattening lambda, classifier) and of torchvision's AlexNet(num_classes=10) as
// training/pipeline_parallelism/train.py joins it (features, avgpool, lambda, classifier).
const std::vector<double> kCifarAlexNet{23296, 0, 0, 307392, 0, 0, 663936, 0, 884992, 0, 590080,
                                        0,     0, 0, 0,      1052672, 0, 0, 16781312, 0, 40970};
const std::vector<double> kTorchvisionAlexNet{23296, 0, 0, 307392, 0, 0, 663936, 0, 884992, 0, 590080, 0,
                                              0,     0, 0, 0,      37752832, 0, 0, 16781312, 0, 40970};

TEST(DeepSpeedPartition, BalancedMatchesDeepSpeedCutForCut) {
  const std::vector<Case> cases{
      {kCifarAlexNet, 2, {18, 3}},
      {kCifarAlexNet, 3, {10, 8, 3}},
      {kCifarAlexNet, 4, {8, 7, 3, 3}},
      {kTorchvisionAlexNet, 2, {19, 3}},
      {kTorchvisionAlexNet, 3, {16, 3, 3}},
      {kTorchvisionAlexNet, 4, {8, 8, 3, 3}},
      {{1, 2, 3, 4, 5, 6}, 2, {4, 2}},
      {{1, 2, 3, 4, 5, 6}, 3, {3, 2, 1}},
      {{1, 1, 1, 1}, 2, {2, 2}},
      {{1, 1, 1, 1}, 3, {2, 1, 1}},
      {{0, 0, 5, 0, 0}, 2, {4, 1}},
      {{0, 0, 5, 0, 0}, 3, {3, 1, 1}},
      {{5, 0, 0, 0, 5}, 2, {4, 1}},
      {{3, 3, 3, 3, 3, 3, 3}, 3, {3, 2, 2}},
      {{1, 0, 1, 0, 1, 0, 1, 0}, 2, {4, 4}},
      {{1, 0, 1, 0, 1, 0, 1, 0}, 3, {4, 2, 2}},
      {{10, 1, 1, 1, 1, 1, 1, 1, 1, 10}, 3, {1, 8, 1}},
      {{0, 0, 0, 0}, 2, {3, 1}},
      {{144, 0, 272, 0, 272, 0, 68}, 2, {4, 3}},
      {{144, 0, 272, 0, 272, 0, 68}, 3, {2, 2, 3}},
      {{144, 273, 32, 0, 273, 68}, 2, {2, 4}},
      {{144, 273, 32, 0, 273, 68}, 3, {1, 3, 2}},
      {{2.5, 0.5, 1.0, 3.0}, 2, {3, 1}},
      {{4, 5, 8, 0, 7, 3, 0, 2, 1, 5, 7, 3}, 2, {5, 7}},
      {{4, 5, 8, 0, 7, 3, 0, 2, 1, 5, 7, 3}, 3, {4, 5, 3}},
      {{8, 1, 9, 3, 0, 3, 6, 4, 2}, 2, {3, 6}},
      {{8, 1, 9, 3, 0, 3, 6, 4, 2}, 3, {2, 4, 3}},
      {{2, 1, 2, 9, 9, 7, 2, 2, 0}, 2, {4, 5}},
      {{2, 1, 2, 9, 9, 7, 2, 2, 0}, 3, {4, 1, 4}},
      {{3, 3, 2}, 2, {1, 2}},
      {{3, 3, 2}, 3, {1, 1, 1}},
      {{4, 5, 3, 8, 3}, 2, {3, 2}},
      {{4, 5, 3, 8, 3}, 3, {1, 2, 2}},
      {{3, 6, 4, 0, 5}, 2, {2, 3}},
      {{3, 6, 4, 0, 5}, 3, {2, 2, 1}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(deepspeed_partition_balanced(c.weights, c.parts), c.balance)
        << "weights of " << c.weights.size() << " layers into " << c.parts << " parts";
  }
}

TEST(DeepSpeedPartition, UniformGivesTheFirstStagesTheRemainder) {
  EXPECT_EQ(deepspeed_partition_uniform(21, 2), (std::vector<int64_t>{11, 10}));
  EXPECT_EQ(deepspeed_partition_uniform(21, 4), (std::vector<int64_t>{6, 5, 5, 5}));
  EXPECT_EQ(deepspeed_partition_uniform(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(deepspeed_partition_uniform(11, 4), (std::vector<int64_t>{3, 3, 3, 2}));
  EXPECT_EQ(deepspeed_partition_uniform(4, 4), (std::vector<int64_t>{1, 1, 1, 1}));
}

TEST(DeepSpeedPartition, RefusesWhatWouldLeaveAStageEmptyOrIsNotAWeight) {
  EXPECT_THROW(deepspeed_partition_uniform(3, 4), BalanceError);
  EXPECT_THROW(deepspeed_partition_balanced({1, 2, 3}, 4), BalanceError);
  EXPECT_THROW(deepspeed_partition_balanced({1, 2, 3}, 0), ConfigError);
  EXPECT_THROW(deepspeed_partition_balanced({1, -2, 3}, 2), ConfigError);
  EXPECT_THROW(deepspeed_partition_balanced({1, std::numeric_limits<double>::quiet_NaN(), 3}, 2), ConfigError);
  EXPECT_EQ(deepspeed_partition_balanced({7, 0, 9}, 3), (std::vector<int64_t>{1, 1, 1}));
}

}  // namespace
}  // namespace pipetrain
