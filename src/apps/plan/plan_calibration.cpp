// The planner's machine constants and their environment overrides.
#include "apps/plan/plan_calibration.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>

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
  if (c.link.bytes_per_s <= 0 || c.link.allreduce_bytes_per_s <= 0)
    throw ConfigError("PIPETRAIN_PLAN_BANDWIDTH_MBS and PIPETRAIN_PLAN_ALLREDUCE_MBS must be > 0");
  return c;
}

}  // namespace pipetrain::apps
