// Timed events (simulated or measured) and the bubble they show.
//
// The same event list feeds the Chrome trace and SVG renderers and the bubble statistics, so
// an engine that records its real (op, micro-batch, start, end) per stage gets the measured
// bubble computed exactly as the simulator computes the predicted one.
#pragma once

#include <vector>

#include "pipetrain/schedule/action.h"

namespace pipetrain::schedule {

struct TimedEvent {
  int stage = 0;  // the row: a stage, or a rank for measured runs
  Op op = Op::forward;
  int micro_batch = -1;  // -1 where the op has none
  int chunk = 0;
  double start = 0;  // any unit (simulated cost units, seconds); end >= start
  double end = 0;
};

struct BubbleStats {
  double makespan = 0;         // last end - first start
  std::vector<double> busy;    // per row: summed duration of compute events
  std::vector<double> bubble;  // per row: 1 - busy / makespan
  double overall = 0;          // 1 - sum(busy) / (rows * makespan)
};

// Compute events (forward and the backward kinds) count as busy; everything else, including
// time spent blocked in a receive, is bubble. `num_rows` <= 0 takes the largest stage + 1.
BubbleStats bubble_stats(const std::vector<TimedEvent>& events, int num_rows = 0);

}  // namespace pipetrain::schedule
