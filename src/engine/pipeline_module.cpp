// Cutting a layer list into stages and building a stage's layers reproducibly.
#include "pipetrain/engine/pipeline_module.h"

#include <numeric>

#include "pipetrain/error.h"
#include "pipetrain/partition/balance.h"
#include "pipetrain/partition/min_max.h"
#include "pipetrain/runtime/rng.h"

namespace pipetrain {

namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return "[" + out + "]";
}

void check_explicit(const std::vector<int64_t>& balance, int64_t layers, int64_t parts) {
  if (static_cast<int64_t>(balance.size()) != parts) {
    throw BalanceError("pipeline.balance " + join(balance) + " has " + std::to_string(balance.size()) +
                       " entries but the pipeline has " + std::to_string(parts) +
                       " parts (stages x chunks); give one layer count per part");
  }
  for (int64_t b : balance) {
    if (b <= 0) {
      throw BalanceError("pipeline.balance " + join(balance) +
                         " has an entry <= 0; every part needs at least one layer");
    }
  }
  const int64_t sum = std::accumulate(balance.begin(), balance.end(), int64_t{0});
  if (sum != layers) {
    throw BalanceError("pipeline.balance " + join(balance) + " sums to " + std::to_string(sum) +
                       " but the model has " + std::to_string(layers) +
                       " layers; fix the counts or use partition_method \"parameters\" or \"uniform\"");
  }
}

}  // namespace

std::vector<int64_t> partition_layers(const std::vector<LayerSpec>& layers,
                                      const PipelineConfig& config, int64_t parts) {
  const auto n = static_cast<int64_t>(layers.size());
  if (parts < 1) throw ConfigError("a pipeline needs at least one part, got " + std::to_string(parts));
  const auto& method = config.partition_method;
  if (method == "balance") {
    check_explicit(config.balance, n, parts);
    return config.balance;
  }
  if (n < parts) {
    throw BalanceError("the model has " + std::to_string(n) + " layers, fewer than the " +
                       std::to_string(parts) +
                       " parts (stages x chunks) of the pipeline; use fewer stages or chunks");
  }
  if (method == "uniform") return balance_uniform(n, parts);
  std::vector<double> costs;
  if (method == "parameters") {
    {
      // Counting builds every layer once: keep its draws off the generator other threads use.
      runtime::SeededScope scope(0);
      costs = parameter_costs(layers);
    }
    // Parameter-free layers (activations) still cost something; without this, a stage could
    // end up with all of them and none of the work the count stands for.
    for (auto& c : costs) c += 1.0;
  } else if (method.rfind("type:", 0) == 0) {
    runtime::SeededScope scope(0);  // a spec without a type is built to read its class name
    costs = type_costs(layers, method.substr(5));
  } else {
    throw ConfigError("pipeline.partition_method \"" + method +
                      "\" is unknown; use parameters, uniform, balance or type:REGEX");
  }
  return min_max_partition(costs, parts);
}

std::vector<int64_t> part_offsets(const std::vector<int64_t>& balance) {
  std::vector<int64_t> offsets{0};
  for (int64_t b : balance) offsets.push_back(offsets.back() + b);
  return offsets;
}

uint64_t layer_seed(uint64_t seed, int64_t layer) {
  // Distinct and stable per (seed, layer); the examples' reference trainer uses the same.
  return seed * 1000003ULL + static_cast<uint64_t>(layer);
}

BuiltLayers build_seeded_layers(const std::vector<LayerSpec>& layers, int64_t begin, int64_t end,
                                uint64_t seed) {
  runtime::SeededScope scope(seed);
  return build_layers(layers, begin, end, [seed](int64_t i) { torch::manual_seed(layer_seed(seed, i)); });
}

}  // namespace pipetrain
