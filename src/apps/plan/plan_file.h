// A plan as JSON: what `pipetrain plan` prints last and `train --plan` / `bench --plan` read.
//
//   {"workload":"mlp","example":null,"processes":2,"stages":2,"replicas":1,"micro_batches":8,
//    "micro_batch_size":32,"schedule":"1f1b","chunks":1,"balance":[16,16],"checkpoint":0,
//    "predicted_samples_per_s":1234.5,"predicted_step_ms":207.3,"predicted_peak_memory_mb":150.2,
//    "predicted_peak_memory_mb_per_stage":[...]}
//
// `balance` counts layers per model part (stages x chunks, in the engine's virtual-stage
// order); `checkpoint` is pipeline.activation_checkpoint_interval (0: off).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipetrain/engine/config.h"

namespace pipetrain::apps {

struct PlanSpec {
  std::string workload;  // "mlp", "mlp-4", or empty
  std::string example;   // "cnn", "gpt", "mlp", or empty
  int processes = 1;
  int stages = 1;
  int replicas = 1;
  int micro_batches = 1;
  int64_t micro_batch_size = 0;
  std::string schedule = "1f1b";
  int chunks = 1;
  std::vector<int64_t> balance;
  int64_t checkpoint = 0;
  double predicted_samples_per_s = 0;
  double predicted_step_ms = 0;
  double predicted_peak_memory_mb = 0;
  std::vector<double> predicted_peak_memory_mb_per_stage;
};

nlohmann::ordered_json plan_to_json(const PlanSpec& plan);
// ConfigError naming the missing or malformed field.
PlanSpec plan_from_json(const nlohmann::json& j);
// The last line of the file that is a JSON object (the file may hold `pipetrain plan`'s whole
// output). ConfigError when the file cannot be read or holds no JSON line.
PlanSpec read_plan_file(const std::string& path);

// The plan's pipeline on an engine config: stages, schedule, chunks, balance, checkpointing and
// the micro-batch count and size (batch sizes for its replicas).
void apply_plan(const PlanSpec& plan, EngineConfig& config);

}  // namespace pipetrain::apps
