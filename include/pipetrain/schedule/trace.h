// Timed events as a Chrome / Perfetto trace (JSON), for simulated and measured runs alike.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/schedule/timeline.h"

namespace pipetrain::schedule {

struct TraceOptions {
  double microseconds_per_unit = 1000.0;  // simulated units show as ms; measured seconds: 1e6
  std::string process_name = "pipetrain";
  std::string row_name = "stage";  // rows are named "<row_name> <stage>"
};

// {"traceEvents": [...], "displayTimeUnit": "ms"}: one thread per row (sorted by row), a
// complete event ("ph": "X", name = short label such as "F5", category = op name, args with
// op, mb, chunk) per event with a duration, an instant event ("ph": "i") per zero-length one.
// Open it in https://ui.perfetto.dev or chrome://tracing.
std::string render_chrome_trace(const std::vector<TimedEvent>& events,
                                const TraceOptions& options = {});

}  // namespace pipetrain::schedule
