// The loss scaler's state machine (see loss_scaler.h).
#include "pipetrain/engine/loss_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pipetrain/error.h"

namespace pipetrain {

namespace {
constexpr double kScaleFactor = 2.0;  // DeepSpeed's scale_factor
}

LossScaler::LossScaler(const Fp16Config& config) : config_(config), dynamic_(config.loss_scale <= 0) {
  state_.scale = dynamic_ ? std::ldexp(1.0, static_cast<int>(config.initial_scale_power)) : config.loss_scale;
  state_.hysteresis_left = config.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++state_.iteration;
    return;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || state_.hysteresis_left == 1) {
      if (state_.scale <= config_.min_loss_scale) {
        throw NumericError(fmt::format(
            "fp16: gradients overflow at the minimum loss scale ({}) at step {}; the model does not "
            "train in float16 here: lower the learning rate, clip gradients, or use bf16",
            config_.min_loss_scale, state_.iteration + 1));
      }
      state_.scale = std::max(state_.scale / kScaleFactor, config_.min_loss_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow = state_.iteration;
  } else if ((state_.iteration - state_.last_overflow) % config_.loss_scale_window == 0) {
    state_.hysteresis_left = config_.hysteresis;
    state_.scale *= kScaleFactor;
  }
  ++state_.iteration;
}

}  // namespace pipetrain
