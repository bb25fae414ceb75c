// A model for the PipelineEngine: layer specs, a loss, and how to cut them into stages
// (DeepSpeed's PipelineModule).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/engine/config.h"
#include "pipetrain/partition/layer_spec.h"

namespace pipetrain {

// The loss of one micro-batch from the last layer's output and the labels: a scalar. The
// engine divides it by the number of micro-batches, so a per-micro-batch mean gives the
// gradient of the mini-batch mean.
using LossFn = std::function<torch::Tensor(const Batch& outputs, const Batch& labels)>;

struct PipelineModule {
  std::vector<LayerSpec> layers;
  LossFn loss;
  // Pipeline stages; 0 takes config.pipeline.stages, else the world size / replicas.
  int64_t num_stages = 0;
};

// The layer count of each of `parts` consecutive parts (virtual stages) under
// config.partition_method: "uniform", "parameters" (balanced parameter counts), "type:REGEX"
// (balanced count of layers whose type matches) or "balance" (config.balance, which must have
// `parts` positive entries summing to the layer count). BalanceError names what is wrong.
std::vector<int64_t> partition_layers(const std::vector<LayerSpec>& layers,
                                      const PipelineConfig& config, int64_t parts);

// First layer index of each part, plus the layer count at the end.
std::vector<int64_t> part_offsets(const std::vector<int64_t>& balance);

// The generator seed of layer `layer` in a model seeded with `seed`.
uint64_t layer_seed(uint64_t seed, int64_t layer);

// Builds layers [begin, end) so that layer i's initial weights depend only on (seed, i), not
// on which stage builds it: the generator is seeded with layer_seed(seed, i) before layer i. Holds a
// process-wide lock and puts the generator back afterwards, so ranks that are threads of one
// process (tests) can build at the same time.
BuiltLayers build_seeded_layers(const std::vector<LayerSpec>& layers, int64_t begin, int64_t end,
                                uint64_t seed);

}  // namespace pipetrain
