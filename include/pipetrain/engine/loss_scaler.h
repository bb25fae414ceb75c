// fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py): the
// loss is multiplied by the scale before backward so small float16 gradients do not flush to
// zero; a step whose gradients overflow is skipped. Dynamic scaling halves the scale once
// `hysteresis` overflows have been seen and doubles it after `loss_scale_window` steps without
// one; a fixed scale (loss_scale > 0) never moves.
#pragma once

#include <cstdint>

#include "pipetrain/engine/config.h"

namespace pipetrain {

class LossScaler {
 public:
  // What a checkpoint keeps, so a resumed run scales as the uninterrupted one would.
  struct State {
    double scale = 1.0;
    int64_t iteration = 0;            // steps seen (taken or skipped)
    int64_t last_overflow = -1;       // iteration of the last overflow; -1: none yet
    int64_t hysteresis_left = 1;      // overflows still tolerated before the next halving
  };

  explicit LossScaler(const Fp16Config& config);

  double scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }
  const State& state() const { return state_; }
  void restore(const State& state) { state_ = state; }

  // After a step: `overflow` when any rank saw a non-finite gradient (the step is skipped).
  // NumericError when the scale is already at min_loss_scale and overflows again, as
  // DeepSpeed stops there.
  void update(bool overflow);

 private:
  Fp16Config config_;
  bool dynamic_;
  State state_;
};

}  // namespace pipetrain
