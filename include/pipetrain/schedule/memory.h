// The memory model: per stage, the bytes a schedule holds at its peak.
//
// A stage holds its parameters, their gradients and the optimizer's state for the whole step
// (`static_bytes`), and for every micro-batch in flight (its forward done, its last backward
// action not yet) what that forward left for the backward (`activation_bytes`, per micro-batch
// through the whole stage; a chunk holds 1/V of it). Under activation checkpointing a
// micro-batch in flight holds only its checkpoint inputs, and the backward recomputes one
// segment, holding that segment's activations on top for as long as it runs (`transient_bytes`,
// counted at every backward action). So
//
//   peak[j] = static[j] + max over positions k of stage j's list of
//               live(k) * activation[j] / V  +  held(k) * weight[j] / V
//               + (action k is a backward ? transient[j] / V : 0)
//
// where live(k) counts the (chunk, micro-batch) pairs whose forward ran at or before k and
// whose backward or backward_input runs at or after k, and held(k) those whose last backward
// action (a deferred backward_weight) runs at or after k: a split backward frees the graph at
// I, but the Linear fast path keeps its inputs until W. Pure: no torch,
// the bytes come from a profile (runtime/layer_profile.h) or a hand calculation.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

struct StageMemory {
  double static_bytes = 0;      // parameters + gradients + optimizer state
  double activation_bytes = 0;  // held per micro-batch in flight (whole stage, all chunks)
  double transient_bytes = 0;   // extra while a backward runs (a checkpoint's recompute)
  // Held per micro-batch in flight until its last backward action (a deferred weight
  // gradient's inputs), where activation_bytes go at its input-gradient backward.
  double weight_bytes = 0;
};

// Bytes of optimizer state per byte of parameters: 2 for Adam/AdamW (two moments), 1 for SGD
// with momentum, RMSprop and Adagrad, 0 for plain SGD. ConfigError for an unknown optimizer.
double optimizer_state_factor(const std::string& optimizer, double momentum = 0);

// Per stage: the peak bytes as drawn above. ConfigError when `memory` has not one entry per
// stage or holds a negative or non-finite value.
std::vector<double> peak_memory_bytes(const Schedule& schedule, const std::vector<StageMemory>& memory);

}  // namespace pipetrain::schedule
