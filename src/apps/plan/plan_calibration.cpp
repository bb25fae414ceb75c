// The planner's machine constants and their environment overrides.
#include "apps/plan/plan_calibration.h"

#include <fmt/format.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "pipetrain/error.h"

namespace pipetrain::apps {
namespace {

double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (*end != '\0' || !std::isfinite(x) || x < 0)
    throw ConfigError(fmt::format("{}='{}' is not a number >= 0", name, v));
  return x;
}

}  // namespace

Calibration calibration() {
  Calibration c;
  c.link.latency_s = env_number("PIPETRAIN_PLAN_LATENCY_US", 1000) * 1e-6;
  c.link.bytes_per_s = env_number("PIPETRAIN_PLAN_BANDWIDTH_MBS", 2000) * 1e6;
  c.link.send_s = env_number("PIPETRAIN_PLAN_SEND_US", 20) * 1e-6;
  c.link.allreduce_bytes_per_s = env_number("PIPETRAIN_PLAN_ALLREDUCE_MBS", 400) * 1e6;
  c.step_overhead_s = env_number("PIPETRAIN_PLAN_OVERHEAD_MS", 1) * 1e-3;
  c.compute_scale = env_number("PIPETRAIN_PLAN_COMPUTE_SCALE", 1);
  // Four mlp-4 ranks on two cores, 200 steps under /usr/bin/time (2026-12-05): interleaved V=2
  // M=4 took 162 ms of user and 31 ms of system time a step for 134 ms of profiled work and 56
  // messages; 1f1b M=2, 155 and 21 ms for 12 messages. So the compute ran at 134 / 162 = 0.83 of
  // its profiled speed, and each message cost about (193 - 176) / (56 - 12) = 0.4 ms of CPU.
  c.shared_efficiency = env_number("PIPETRAIN_PLAN_SHARED_EFFICIENCY", 0.83);
  c.shared_message_s = env_number("PIPETRAIN_PLAN_SHARED_MESSAGE_US", 400) * 1e-6;
  if (c.shared_efficiency <= 0 || c.shared_efficiency > 1)
    throw ConfigError(fmt::format("PIPETRAIN_PLAN_SHARED_EFFICIENCY={} must be in (0, 1]", c.shared_efficiency));
  if (c.link.bytes_per_s <= 0 || c.link.allreduce_bytes_per_s <= 0)
    throw ConfigError("PIPETRAIN_PLAN_BANDWIDTH_MBS and PIPETRAIN_PLAN_ALLREDUCE_MBS must be > 0");
  return c;
}

double stream_bytes_per_s() {
  const double set = env_number("PIPETRAIN_PLAN_STREAM_MBS", 0);
  if (set > 0) return set * 1e6;
  torch::NoGradGuard no_grad;
  // Twice this machine's 32 MiB L3 each, so every pass comes from memory as a stage's does.
  const int64_t n = 16 << 20;
  auto a = torch::ones({n});
  auto b = torch::ones({n});
  a.add_(b, -1e-9f);  // first touch outside the timing
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    a.add_(b, -1e-9f);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + 2, seconds.end());
  return 3.0 * static_cast<double>(n) * sizeof(float) / seconds[2];
}

}  // namespace pipetrain::apps
