// Save and load the planner's measured inputs (plan_profile_file.h) as one JSON object.
#include "apps/plan/plan_profile_file.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/error.h"

namespace pipetrain::apps {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "pipetrain-plan-profile-1";

json costs_to_json(const schedule::LayerCosts& c) {
  return {{"forward", c.forward},
          {"backward_input", c.backward_input},
          {"backward_weight", c.backward_weight},
          {"optimizer", c.optimizer},
          {"activation_bytes", c.activation_bytes},
          {"output_bytes", c.output_bytes},
          {"param_bytes", c.param_bytes},
          {"state_bytes", c.state_bytes},
          {"weight_bytes", c.weight_bytes},
          {"input_bytes", c.input_bytes}};
}

schedule::LayerCosts costs_from_json(const json& j) {
  schedule::LayerCosts c;
  j.at("forward").get_to(c.forward);
  j.at("backward_input").get_to(c.backward_input);
  j.at("backward_weight").get_to(c.backward_weight);
  j.at("optimizer").get_to(c.optimizer);
  j.at("activation_bytes").get_to(c.activation_bytes);
  j.at("output_bytes").get_to(c.output_bytes);
  j.at("param_bytes").get_to(c.param_bytes);
  j.at("state_bytes").get_to(c.state_bytes);
  j.at("weight_bytes").get_to(c.weight_bytes);
  j.at("input_bytes").get_to(c.input_bytes);
  const size_t n = c.forward.size();
  for (const auto* v : {&c.backward_input, &c.backward_weight, &c.optimizer, &c.activation_bytes, &c.output_bytes,
                        &c.param_bytes}) {
    if (v->size() != n) throw std::invalid_argument(fmt::format("per-layer lists of {} and {} entries", n, v->size()));
  }
  return c;
}

}  // namespace

void save_plan_profile(const PlanProfile& p, const std::string& path) {
  json costs = json::object();
  for (const auto& [m, c] : p.costs) costs[std::to_string(m)] = costs_to_json(c);
  const json j = {{"format", kFormat},
                  {"workload", p.workload},
                  {"example", p.example},
                  {"gemm_kernel", p.gemm_kernel},
                  {"processes", p.processes},
                  {"cores", p.cores},
                  {"profile_alone", p.profile_alone},
                  {"optimizer", p.optimizer},
                  {"optimizer_state_factor", p.optimizer_state_factor},
                  {"fill_waits", p.fill_waits},
                  {"stream_bytes_per_s", p.stream_bytes_per_s},
                  {"costs", costs}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump() << '\n';
    if (!out.flush()) throw ConfigError(fmt::format("--save-profile {}: cannot write {}", path, tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw ConfigError(fmt::format("--save-profile {}: cannot rename {} to it: {}", path, tmp, ec.message()));
}

PlanProfile load_plan_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("--load-profile {}: cannot open it; write it with plan --save-profile", path));
  PlanProfile p;
  try {
    const json j = json::parse(in);
    if (j.value("format", "") != kFormat)
      throw std::invalid_argument(fmt::format("\"format\" is not \"{}\"", kFormat));
    j.at("workload").get_to(p.workload);
    j.at("example").get_to(p.example);
    j.at("gemm_kernel").get_to(p.gemm_kernel);
    j.at("processes").get_to(p.processes);
    j.at("cores").get_to(p.cores);
    j.at("profile_alone").get_to(p.profile_alone);
    j.at("optimizer").get_to(p.optimizer);
    j.at("optimizer_state_factor").get_to(p.optimizer_state_factor);
    j.at("fill_waits").get_to(p.fill_waits);
    j.at("stream_bytes_per_s").get_to(p.stream_bytes_per_s);
    for (const auto& [m, c] : j.at("costs").items()) p.costs[std::stoi(m)] = costs_from_json(c);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("--load-profile {}: not a profile written by plan --save-profile ({})", path,
                                  e.what()));
  }
  if (p.costs.empty()) throw ConfigError(fmt::format("--load-profile {}: it holds no costs", path));
  return p;
}

void check_profile_matches(const PlanProfile& loaded, const PlanProfile& wanted, const std::string& path) {
  auto differ = [&](const char* field, const auto& was, const auto& now) {
    if (was == now) return;
    throw ConfigError(fmt::format("--load-profile {}: it was profiled with {} {}, this plan has {}; plan with the "
                                  "same {} or profile again (--save-profile)",
                                  path, field, was, now, field));
  };
  differ("workload", loaded.workload, wanted.workload);
  differ("example", loaded.example, wanted.example);
  differ("gemm kernel", loaded.gemm_kernel, wanted.gemm_kernel);
  differ("processes", loaded.processes, wanted.processes);
  differ("cores", loaded.cores, wanted.cores);
  differ("profile-alone", loaded.profile_alone, wanted.profile_alone);
  for (const auto& [m, c] : wanted.costs) {
    if (!loaded.costs.count(m))
      throw ConfigError(fmt::format("--load-profile {}: it has no costs at {} micro-batches; plan with fewer "
                                    "(--max-micro-batches) or profile again (--save-profile)",
                                    path, m));
  }
}

}  // namespace pipetrain::apps
