// A measured layer profile as the planner's and the simulator's per-layer costs.
#pragma once

#include "pipetrain/runtime/layer_profile.h"
#include "pipetrain/schedule/plan.h"

namespace pipetrain::apps {

schedule::LayerCosts layer_costs(const runtime::LayerProfile& profile);

}  // namespace pipetrain::apps
