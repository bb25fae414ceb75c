// Plans as JSON lines, read back from `pipetrain plan`'s output and applied to engine configs.
#include "apps/plan/plan_file.h"

#include <fmt/format.h>

#include <fstream>

#include "pipetrain/error.h"

namespace pipetrain::apps {

using json = nlohmann::json;

nlohmann::ordered_json plan_to_json(const PlanSpec& p) {
  nlohmann::ordered_json j;
  j["workload"] = p.workload.empty() ? json(nullptr) : json(p.workload);
  j["example"] = p.example.empty() ? json(nullptr) : json(p.example);
  j["processes"] = p.processes;
  j["stages"] = p.stages;
  j["replicas"] = p.replicas;
  j["micro_batches"] = p.micro_batches;
  j["micro_batch_size"] = p.micro_batch_size;
  j["schedule"] = p.schedule;
  j["chunks"] = p.chunks;
  j["balance"] = p.balance;
  j["checkpoint"] = p.checkpoint;
  j["predicted_samples_per_s"] = p.predicted_samples_per_s;
  j["predicted_step_ms"] = p.predicted_step_ms;
  j["predicted_peak_memory_mb"] = p.predicted_peak_memory_mb;
  j["predicted_peak_memory_mb_per_stage"] = p.predicted_peak_memory_mb_per_stage;
  return j;
}

PlanSpec plan_from_json(const json& j) {
  if (!j.is_object()) throw ConfigError("a plan is a JSON object, got " + std::string(j.type_name()));
  auto need = [&](const char* key) -> const json& {
    if (!j.contains(key) || j.at(key).is_null())
      throw ConfigError(fmt::format("the plan has no \"{}\"; write it with pipetrain plan --json", key));
    return j.at(key);
  };
  PlanSpec p;
  try {
    if (j.contains("workload") && j["workload"].is_string()) p.workload = j["workload"];
    if (j.contains("example") && j["example"].is_string()) p.example = j["example"];
    p.stages = need("stages").get<int>();
    p.replicas = j.value("replicas", 1);
    p.processes = j.value("processes", p.stages * p.replicas);
    p.micro_batches = need("micro_batches").get<int>();
    p.micro_batch_size = j.value("micro_batch_size", int64_t{0});
    p.schedule = need("schedule").get<std::string>();
    p.chunks = j.value("chunks", 1);
    p.balance = need("balance").get<std::vector<int64_t>>();
    const json& ck = j.contains("checkpoint") ? j["checkpoint"] : json(0);
    p.checkpoint = ck.is_boolean() ? (ck.get<bool>() ? 1 : 0) : ck.get<int64_t>();
    p.predicted_samples_per_s = j.value("predicted_samples_per_s", 0.0);
    p.predicted_step_ms = j.value("predicted_step_ms", 0.0);
    p.predicted_peak_memory_mb = j.value("predicted_peak_memory_mb", 0.0);
    if (j.contains("predicted_peak_memory_mb_per_stage"))
      p.predicted_peak_memory_mb_per_stage = j["predicted_peak_memory_mb_per_stage"].get<std::vector<double>>();
  } catch (const json::exception& e) {
    throw ConfigError(std::string("the plan has a field of the wrong type: ") + e.what());
  }
  if (p.stages < 1 || p.replicas < 1 || p.micro_batches < 1 || p.chunks < 1)
    throw ConfigError(fmt::format("the plan's stages {}, replicas {}, micro_batches {} and chunks {} must all be >= 1",
                                  p.stages, p.replicas, p.micro_batches, p.chunks));
  if (static_cast<int>(p.balance.size()) != p.stages * p.chunks)
    throw ConfigError(fmt::format("the plan's balance has {} entries; {} stages x {} chunks need {}", p.balance.size(),
                                  p.stages, p.chunks, p.stages * p.chunks));
  return p;
}

PlanSpec read_plan_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("--plan {}: cannot read the file (write it with pipetrain plan > FILE)", path));
  std::string line, last;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line[first] == '{') last = line;
  }
  if (last.empty())
    throw ConfigError(fmt::format("--plan {}: no JSON line in the file; it should end with pipetrain plan's JSON line", path));
  json j;
  try {
    j = json::parse(last);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("--plan {}: the last JSON line does not parse: {}", path, e.what()));
  }
  return plan_from_json(j);
}

void apply_plan(const PlanSpec& p, EngineConfig& c) {
  c.pipeline.stages = p.stages;
  c.pipeline.schedule = p.schedule;
  c.pipeline.chunks = p.chunks;
  c.pipeline.partition_method = "balance";
  c.pipeline.balance = p.balance;
  c.pipeline.activation_checkpoint_interval = p.checkpoint;
  c.gradient_accumulation_steps = p.micro_batches;
  if (p.micro_batch_size > 0) c.train_micro_batch_size_per_gpu = p.micro_batch_size;
  c.train_batch_size = c.train_micro_batch_size_per_gpu * p.micro_batches * p.replicas;
}

}  // namespace pipetrain::apps
