// Test helper: simulated compute steps drawn as text, one fixed-width column per time unit.
#pragma once

#include <cmath>
#include <string>

#include "pipetrain/schedule/simulate.h"

namespace pipetrain::schedule::testing {

// Each compute step prints its short label, right-aligned in `width` characters, once per unit
// it lasts (" B0 B0" for a backward of 2 units); idle units print a dot. Costs must be whole
// units.
inline std::string timeline_text(const SimulationResult& result, size_t width = 3) {
  std::string out;
  for (size_t j = 0; j < result.timeline.size(); ++j) {
    std::string row = "stage " + std::to_string(j) + ":";
    double clock = 0;
    for (const TimedAction& t : result.timeline[j]) {
      if (!is_compute(t.action.op) || t.end <= t.start) continue;
      for (; clock + 0.5 < t.start; clock += 1) row += std::string(width - 1, ' ') + ".";
      std::string label = short_label(t.action);
      label = std::string(label.size() < width ? width - label.size() : 0, ' ') + label;
      for (long u = std::lround(t.end - t.start); u > 0; --u) row += label;
      clock = t.end;
    }
    out += row + "\n";
  }
  return out;
}

}  // namespace pipetrain::schedule::testing
