// The schedule tests' shorthand for generating a schedule.
#pragma once

#include "pipetrain/schedule/generate.h"

namespace pipetrain::schedule::testing {

// The schedule of `kind` for P stages and M micro-batches (V: chunks per stage, 0 = its default).
inline Schedule make(ScheduleKind kind, int P, int M, int V = 0) {
  return generate(ScheduleOptions(kind, P, M).chunks(V));
}

}  // namespace pipetrain::schedule::testing
