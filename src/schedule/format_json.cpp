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

std::string to_json(const Schedule& s, int only_stage, int indent) {
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  nlohmann::ordered_json virtual_stages = nlohmann::ordered_json::array();
  for (int j = 0; j < static_cast<int>(s.stages.size()); ++j) {
    nlohmann::ordered_json actions = nlohmann::ordered_json::array();
    if (only_stage < 0 || only_stage == j)
      for (const Action& a : s.stages[j]) actions.push_back(action_json(a));
    stages.push_back(std::move(actions));
  }
  for (int j = 0; j < s.num_stages(); ++j) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array();
    for (int c = 0; c < s.num_chunks(); ++c) row.push_back(s.layout.virtual_stage(j, c));
    virtual_stages.push_back(std::move(row));
  }
  nlohmann::ordered_json out = {{"kind", kind_name(s.kind)},
                        {"training", s.training},
                        {"num_stages", s.num_stages()},
                        {"num_micro_batches", s.num_micro_batches},
                        {"num_chunks", s.num_chunks()},
                        {"layout", layout_name(s.layout.kind())},
                        {"virtual_stages", std::move(virtual_stages)},
                        {"buffers", s.buffers}};
  if (only_stage >= 0) out["selected_stage"] = only_stage;
  out["stages"] = std::move(stages);
  return out.dump(indent);
}

}  // namespace pipetrain::schedule
