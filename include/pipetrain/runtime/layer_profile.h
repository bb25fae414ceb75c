// Profiling each layer of a model as the engine runs it: forward, input-gradient and
// weight-gradient time, the bytes a forward leaves for its backward, output and parameter
// bytes, and the optimizer step's time. The planner's costs (schedule/plan.h) come from here.
//
// Each layer runs as a one-layer runtime::StageModel with the engine's options (the Linear
// fast path splits its backward into B and W exactly as a stage does), on the previous layer's
// output, detached, so its backward is its own. Activation bytes come from a second, connected
// forward of the whole chain under an AllocationCounter: the bytes still alive after a layer
// minus those alive before it (a Linear's output that the next ReLU replaces is not counted;
// what autograd or the fast path keeps is).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/partition/layer_spec.h"
#include "pipetrain/runtime/stage_model.h"

namespace pipetrain::runtime {

struct LayerCost {
  double forward_s = 0;
  double backward_input_s = 0;   // the whole backward for layers without a fast path
  double backward_weight_s = 0;  // the fast path's weight gradient (0 for other layers)
  double optimizer_s = 0;        // the engine's end of step for the layer's parameters: the
                                 // gradient norm, then one optimizer step, caches cold
  double activation_bytes = 0;   // kept from forward to backward, per micro-batch
  double weight_bytes = 0;       // of those, kept until the weight gradient (the fast path's input)
  double output_bytes = 0;       // the layer's output (what a stage boundary after it sends)
  double param_bytes = 0;        // parameters (tied layers: at their first use only)
  double state_bytes = 0;        // kept between steps besides the parameters: gradients, the
                                 // optimizer's state, the fast path's cached weight copies
};

struct LayerProfile {
  std::vector<LayerCost> layers;
  double input_bytes = 0;  // the sample's bytes (the first stage's input)
  int64_t rows = 0;        // the sample's rows (micro-batch size)
  bool accumulates_natively = false;  // some layer queues weight work natively (fill_waits)
};

struct LayerProfileOptions {
  std::chrono::milliseconds budget{300};  // timing passes run until this is spent
  int64_t min_passes = 3;                 // the first pass is a warm-up and is not counted;
                                          // each time is the median over the others
  StageModelOptions stage;                // the engine's (fast path, GEMM kernel); no checkpoints
  std::string optimizer = "SGD";          // SGD, Adam or AdamW: the step that is timed
  // Written before each timed optimizer step so the layer's tensors come from memory, as after
  // a stage's weight-gradient pass over all its layers (more than this machine's 32 MiB L3).
  int64_t evict_bytes = int64_t{64} << 20;
};

// Builds the specs (each once, tied ones shared) and profiles every layer on `sample`.
// ConfigError for a model with skip connections (a layer's backward would not be its own).
LayerProfile profile_layers(const std::vector<LayerSpec>& specs, const Batch& sample,
                            const LayerProfileOptions& options = {});

// A detached copy of `batch` whose floating tensors require grad, so a layer's backward stops
// at its input (the profilers time one layer at a time).
Batch detached_input(const Batch& batch);
// Runs the backward of `output`'s tensors that require grad, with all-ones gradients.
void backward_ones(const Batch& output);

}  // namespace pipetrain::runtime
