// The fp16 loss scaler's state machine against DeepSpeed's DynamicLossScaler.update_scale.
#include "pipetrain/engine/loss_scaler.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

Fp16Config dynamic(int64_t power, int64_t window, int64_t hysteresis, double min_scale = 1.0) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min_scale;
  return c;
}

TEST(LossScaler, StartsAtTwoToTheInitialPower) {
  EXPECT_EQ(LossScaler(dynamic(16, 1000, 2)).scale(), 65536.0);
  EXPECT_EQ(LossScaler(Fp16Config{}).scale(), 65536.0);  // DeepSpeed's defaults
}

TEST(LossScaler, GrowsAfterAWindowWithoutOverflow) {
  LossScaler s(dynamic(4, 3, 1));
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // the third clean step closes the window
  EXPECT_EQ(s.scale(), 32.0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 32.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 64.0);
}

TEST(LossScaler, HysteresisToleratesOverflowsBeforeHalving) {
  LossScaler s(dynamic(10, 1000, 3));
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(true);  // hysteresis used up: halve, and every further overflow halves
  EXPECT_EQ(s.scale(), 512.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_EQ(s.state().last_overflow, 3);
}

TEST(LossScaler, TheWindowCountsFromTheLastOverflowAndRestoresHysteresis) {
  LossScaler s(dynamic(8, 2, 2));
  s.update(true);   // iteration 0: hysteresis 2 -> 1
  s.update(false);  // (1 - 0) % 2 != 0
  EXPECT_EQ(s.scale(), 256.0);
  s.update(false);  // (2 - 0) % 2 == 0: grow, hysteresis back to 2
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  s.update(true);   // tolerated again
  EXPECT_EQ(s.scale(), 512.0);
}

TEST(LossScaler, NeverBelowTheMinimumAndStopsThereAsDeepSpeedDoes) {
  LossScaler s(dynamic(2, 1000, 1, 2.0));
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
  try {
    s.update(true);
    FAIL() << "an overflow at the minimum scale must stop the run";
  } catch (const NumericError& e) {
    EXPECT_NE(std::string(e.what()).find("minimum loss scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << "names a fix: " << e.what();
  }
}

TEST(LossScaler, AFixedScaleNeverMoves) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 5; ++i) s.update(i % 2 == 0);
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, RestoredStateContinuesTheSameWay) {
  LossScaler a(dynamic(6, 3, 2));
  a.update(true);
  a.update(false);
  LossScaler b(dynamic(6, 3, 2));
  b.restore(a.state());
  for (bool overflow : {false, true, true, false, false, false}) {
    a.update(overflow);
    b.update(overflow);
    EXPECT_EQ(a.scale(), b.scale());
  }
}

}  // namespace
}  // namespace pipetrain
