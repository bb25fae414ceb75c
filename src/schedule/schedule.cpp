// Schedule kinds by name, and the Schedule's derived counts.
#include "pipetrain/schedule/schedule.h"

#include <fmt/format.h>

#include <string>

#include "pipetrain/error.h"

namespace pipetrain::schedule {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::fill_drain, ScheduleKind::one_f_one_b,
                                   ScheduleKind::inference,  ScheduleKind::interleaved,
                                   ScheduleKind::zb_h1,      ScheduleKind::zb_v,
                                   ScheduleKind::dualpipe_v, ScheduleKind::v_half,
                                   ScheduleKind::v_min,      ScheduleKind::custom};

}  // namespace

const char* kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::fill_drain:
      return "fill-drain";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::inference:
      return "inference";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
    case ScheduleKind::zb_v:
      return "zb-v";
    case ScheduleKind::dualpipe_v:
      return "dualpipev";
    case ScheduleKind::v_half:
      return "v-half";
    case ScheduleKind::v_min:
      return "v-min";
    case ScheduleKind::custom:
      return "custom";
  }
  return "unknown";
}

ScheduleKind parse_kind(std::string_view name) {
  std::string known;
  for (ScheduleKind kind : kKinds) {
    if (kind == ScheduleKind::custom) continue;
    if (name == kind_name(kind)) return kind;
    known += (known.empty() ? "" : "|") + std::string(kind_name(kind));
  }
  throw ConfigError(fmt::format("unknown schedule kind '{}': expected one of {}", name, known));
}

bool is_training(ScheduleKind kind) { return kind != ScheduleKind::inference; }

bool is_v_shaped(ScheduleKind kind) {
  return kind == ScheduleKind::zb_v || kind == ScheduleKind::dualpipe_v ||
         kind == ScheduleKind::v_half || kind == ScheduleKind::v_min;
}

std::vector<ScheduleKind> training_kinds() {
  std::vector<ScheduleKind> kinds;
  for (ScheduleKind kind : kKinds)
    if (kind != ScheduleKind::custom && is_training(kind)) kinds.push_back(kind);
  return kinds;
}

size_t Schedule::num_actions() const {
  size_t total = 0;
  for (const auto& actions : stages) total += actions.size();
  return total;
}

}  // namespace pipetrain::schedule
