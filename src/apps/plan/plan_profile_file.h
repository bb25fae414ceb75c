// The planner's measured inputs as a file: `plan --save-profile` writes what it profiled and
// `plan --load-profile` searches from it without profiling again (another search of the same
// model, other calibration constants over the same costs, or tests that must not depend on how
// busy the machine is while they profile).
#pragma once

#include <map>
#include <string>

#include "pipetrain/schedule/plan.h"

namespace pipetrain::apps {

struct PlanProfile {
  // What the costs were measured for: a file is used only for the same.
  std::string workload, example, gemm_kernel;
  int processes = 0, cores = 0;
  bool profile_alone = false;
  // The measured inputs of the search.
  std::string optimizer;
  double optimizer_state_factor = 0;
  bool fill_waits = false;
  double stream_bytes_per_s = 0;
  std::map<int, schedule::LayerCosts> costs;  // by micro-batch count; compute not yet scaled
};

// Writes to a temporary name and renames, so a reader never sees half a file.
void save_plan_profile(const PlanProfile& p, const std::string& path);

// ConfigError naming the path (and the field) for a missing, unreadable or malformed file.
PlanProfile load_plan_profile(const std::string& path);

// ConfigError naming the first field where `loaded` was measured for another subject or layout
// than `wanted` describes, and the fix.
void check_profile_matches(const PlanProfile& loaded, const PlanProfile& wanted, const std::string& path);

}  // namespace pipetrain::apps
