// Chrome / Perfetto trace JSON from timed events.
#include "pipetrain/schedule/trace.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace pipetrain::schedule {

std::string render_chrome_trace(const std::vector<TimedEvent>& events,
                                const TraceOptions& options) {
  using Json = nlohmann::ordered_json;
  Json trace = Json::array();
  trace.push_back({{"name", "process_name"},
                   {"ph", "M"},
                   {"pid", 0},
                   {"args", {{"name", options.process_name}}}});
  int rows = 0;
  for (const TimedEvent& e : events) rows = std::max(rows, e.stage + 1);
  for (int j = 0; j < rows; ++j) {
    trace.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", 0},
                     {"tid", j},
                     {"args", {{"name", options.row_name + " " + std::to_string(j)}}}});
    trace.push_back({{"name", "thread_sort_index"},
                     {"ph", "M"},
                     {"pid", 0},
                     {"tid", j},
                     {"args", {{"sort_index", j}}}});
  }
  const double scale = options.microseconds_per_unit;
  for (const TimedEvent& e : events) {
    Action label;
    label.op = e.op;
    label.micro_batch = e.micro_batch;
    label.chunk = e.chunk;
    Json args = {{"op", op_name(e.op)}};
    if (e.micro_batch >= 0) args["mb"] = e.micro_batch;
    args["chunk"] = e.chunk;
    Json event = {{"name", short_label(label)}, {"cat", op_name(e.op)}};
    if (e.end > e.start) {
      event["ph"] = "X";
      event["ts"] = e.start * scale;
      event["dur"] = (e.end - e.start) * scale;
    } else {
      event["ph"] = "i";
      event["s"] = "t";
      event["ts"] = e.start * scale;
    }
    event["pid"] = 0;
    event["tid"] = e.stage;
    event["args"] = std::move(args);
    trace.push_back(std::move(event));
  }
  return Json{{"traceEvents", std::move(trace)}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace pipetrain::schedule
