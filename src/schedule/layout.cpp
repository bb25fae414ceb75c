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

int Layout::virtual_stage(int stage, int chunk) const {
  if (stage < 0 || stage >= num_stages_ || chunk < 0 || chunk >= num_chunks_)
    throw ScheduleError(fmt::format("layout: (stage {}, chunk {}) is outside {} stages x {} chunks",
                                    stage, chunk, num_stages_, num_chunks_));
  const bool ascending = kind_ == LayoutKind::v_shape && chunk % 2 == 1;
  return chunk * num_stages_ + (ascending ? num_stages_ - 1 - stage : stage);
}

Placement Layout::placement(int virtual_stage) const {
  if (virtual_stage < 0 || virtual_stage >= num_virtual_stages())
    throw ScheduleError(fmt::format("layout: virtual stage {} is outside 0..{}", virtual_stage,
                                    num_virtual_stages() - 1));
  const int chunk = virtual_stage / num_stages_;
  const int offset = virtual_stage % num_stages_;
  const bool ascending = kind_ == LayoutKind::v_shape && chunk % 2 == 1;
  return {ascending ? num_stages_ - 1 - offset : offset, chunk};
}

}  // namespace pipetrain::schedule
