// The fault hook's call points, shared by the checkpoint writers (layer_checkpoint.h explains
// the phases).
#pragma once

#include <string>

namespace pipetrain {

// Calls the hook set with set_checkpoint_fault_hook, if any.
void checkpoint_fault_point(const std::string& phase);

}  // namespace pipetrain
