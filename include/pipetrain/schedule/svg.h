// Timed events as an SVG timeline: one row per stage, one colour per compute op.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/timeline.h"

namespace pipetrain::schedule {

struct SvgOptions {
  std::string title;  // e.g. timeline_title(); empty: no title line
  int num_rows = 0;   // <= 0: the largest stage in the events + 1
  std::string row_name = "stage";
  int width = 1200;  // pixels
  int row_height = 28;
};

// Compute events as boxes on a grey row (so idle time shows grey), labelled with their
// micro-batch id where the box is wide enough, every box with a tooltip; later chunks of a
// stage in lighter shades; a time axis, a legend and the title.
std::string render_svg(const std::vector<TimedEvent>& events, const SvgOptions& options = {});

// "1f1b: P=4 stages, M=8 micro-batches, V=1, bubble 27.3%".
std::string timeline_title(const Schedule& schedule, double bubble);

}  // namespace pipetrain::schedule
