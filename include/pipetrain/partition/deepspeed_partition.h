// DeepSpeed's two partitioners (deepspeed.runtime.utils.partition_uniform and
// partition_balanced), reproduced cut for cut: a DeepSpeed script's PipelineModule puts each
// layer on the stage DeepSpeed would, so its checkpoints and per-stage code keep working.
#pragma once

#include <cstdint>
#include <vector>

namespace pipetrain {

// `items` layers into `parts` stages of equal counts, the first `items % parts` stages one layer
// longer. Layers per stage; BalanceError when items < parts (DeepSpeed would leave stages empty).
std::vector<int64_t> deepspeed_partition_uniform(int64_t items, int64_t parts);

// DeepSpeed's "parameters" and "type:" split (since DeepSpeed 0.12.5): the contiguous split of
// `weights` that minimises the difference between the heaviest and the lightest stage (not the
// heaviest stage alone, as min_max_partition does), by dynamic programming over prefix sums in
// double precision; among equal costs the last cut considered wins, as in DeepSpeed.
// items == parts gives one layer each. Layers per stage; BalanceError when weights.size() < parts,
// ConfigError when parts < 1 or a weight is negative or not finite.
std::vector<int64_t> deepspeed_partition_balanced(const std::vector<double>& weights, int64_t parts);

}  // namespace pipetrain
