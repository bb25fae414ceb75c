// The JSON form of a schedule (the `pipetrain schedule --format json` output).
#include <nlohmann/json.hpp>

#include "pipetrain/schedule/format.h"

namespace pipetrain::schedule {
namespace {

nlohmann::ordered_json action_json(const Action& a) {
  nlohmann::ordered_json out = {{"op", op_name(a.op)}, {"stage", a.stage}};
  if (has_micro_batch(a.op)) out["mb"] = a.micro_batch;
  out["chunk"] = a.chunk;
  if (a.slot >= 0) out["slot"] = a.slot;
  if (is_comm(a.op)) {
    out["peer_stage"] = a.peer_stage;
    out["peer_chunk"] = a.peer_chunk;
  }
  return out;
}

}  // namespace

std::string to_json(const Schedule& s, int only_stage, bool pretty) {
  nlohmann::ordered_json virtual_stages = nlohmann::ordered_json::array();
  for (int j = 0; j < s.num_stages(); ++j) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array();
    for (int c = 0; c < s.num_chunks(); ++c) row.push_back(s.layout.virtual_stage(j, c));
    virtual_stages.push_back(std::move(row));
  }
  nlohmann::ordered_json head = {{"kind", kind_name(s.kind)},
                                 {"training", s.training},
                                 {"num_stages", s.num_stages()},
                                 {"num_micro_batches", s.num_micro_batches},
                                 {"num_chunks", s.num_chunks()},
                                 {"layout", layout_name(s.layout.kind())},
                                 {"virtual_stages", std::move(virtual_stages)},
                                 {"buffers", s.buffers}};
  if (only_stage >= 0) head["selected_stage"] = only_stage;
  auto selected = [&](size_t j) { return only_stage < 0 || only_stage == static_cast<int>(j); };
  if (!pretty) {
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (size_t j = 0; j < s.stages.size(); ++j) {
      nlohmann::ordered_json actions = nlohmann::ordered_json::array();
      if (selected(j))
        for (const Action& a : s.stages[j]) actions.push_back(action_json(a));
      stages.push_back(std::move(actions));
    }
    head["stages"] = std::move(stages);
    return head.dump();
  }
  // One key per line and one action per line: readable, and still small for long schedules.
  std::string out = "{\n";
  for (auto it = head.begin(); it != head.end(); ++it)
    out += "  " + nlohmann::ordered_json(it.key()).dump() + ": " + it.value().dump() + ",\n";
  out += "  \"stages\": [";
  for (size_t j = 0; j < s.stages.size(); ++j) {
    out += j == 0 ? "\n    [" : ",\n    [";
    if (selected(j)) {
      for (size_t k = 0; k < s.stages[j].size(); ++k)
        out += (k == 0 ? "\n      " : ",\n      ") + action_json(s.stages[j][k]).dump();
      if (!s.stages[j].empty()) out += "\n    ";
    }
    out += "]";
  }
  out += "\n  ]\n}";
  return out;
}

}  // namespace pipetrain::schedule
