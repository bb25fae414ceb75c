// The (stage, chunk) <-> virtual stage mappings of the looped and V-shaped layouts.
#include "pipetrain/schedule/layout.h"

#include <fmt/format.h>

#include "pipetrain/error.h"

namespace pipetrain::schedule {

const char* layout_name(LayoutKind kind) {
  return kind == LayoutKind::looped ? "looped" : "v_shape";
}

Layout::Layout(int num_stages, int num_chunks, LayoutKind kind)
    : num_stages_(num_stages), num_chunks_(num_chunks), kind_(kind) {
  if (num_stages < 1)
    throw ScheduleError(fmt::format("layout: {} stages; a pipeline needs at least 1", num_stages));
  if (num_chunks < 1)
    throw ScheduleError(
        fmt::format("layout: {} chunks per stage; each stage holds at least 1", num_chunks));
}

void Layout::out_of_range(int stage, int chunk) const {
  throw ScheduleError(fmt::format("layout: (stage {}, chunk {}) is outside {} stages x {} chunks",
                                  stage, chunk, num_stages_, num_chunks_));
}

void Layout::out_of_range(int virtual_stage) const {
  throw ScheduleError(fmt::format("layout: virtual stage {} is outside 0..{}", virtual_stage,
                                  num_virtual_stages() - 1));
}

}  // namespace pipetrain::schedule
