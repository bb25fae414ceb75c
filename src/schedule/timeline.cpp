// Bubble statistics of a list of timed events.
#include "pipetrain/schedule/timeline.h"

#include <algorithm>
#include <limits>

namespace pipetrain::schedule {

BubbleStats bubble_stats(const std::vector<TimedEvent>& events, int num_rows) {
  int rows = num_rows;
  if (rows <= 0)
    for (const TimedEvent& e : events) rows = std::max(rows, e.stage + 1);
  BubbleStats stats;
  stats.busy.assign(std::max(rows, 0), 0.0);
  stats.bubble.assign(stats.busy.size(), 0.0);
  if (events.empty() || rows <= 0) return stats;
  double first = std::numeric_limits<double>::infinity();
  double last = -std::numeric_limits<double>::infinity();
  for (const TimedEvent& e : events) {
    first = std::min(first, e.start);
    last = std::max(last, e.end);
    if (is_compute(e.op) && e.stage >= 0 && e.stage < rows) stats.busy[e.stage] += e.end - e.start;
  }
  stats.makespan = last - first;
  if (stats.makespan <= 0) return stats;
  double total = 0;
  for (int j = 0; j < rows; ++j) {
    stats.bubble[j] = 1.0 - stats.busy[j] / stats.makespan;
    total += stats.busy[j];
  }
  stats.overall = 1.0 - total / (rows * stats.makespan);
  return stats;
}

}  // namespace pipetrain::schedule
