// A measured layer profile as the planner's and the simulator's per-layer costs.
#include "apps/plan/profile_costs.h"

namespace pipetrain::apps {

schedule::LayerCosts layer_costs(const runtime::LayerProfile& profile) {
  schedule::LayerCosts c;
  for (const auto& l : profile.layers) {
    c.forward.push_back(l.forward_s);
    c.backward_input.push_back(l.backward_input_s);
    c.backward_weight.push_back(l.backward_weight_s);
    c.optimizer.push_back(l.optimizer_s);
    c.activation_bytes.push_back(l.activation_bytes);
    c.output_bytes.push_back(l.output_bytes);
    c.param_bytes.push_back(l.param_bytes);
    c.state_bytes.push_back(l.state_bytes);
    c.weight_bytes.push_back(l.weight_bytes);
  }
  c.input_bytes = profile.input_bytes;
  return c;
}

}  // namespace pipetrain::apps
