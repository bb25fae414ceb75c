// Deferring weight gradients to the end of a step: a schedule with full backwards becomes
// one with input-gradient backwards and all weight-gradient work just before the step ops.
//
// The engine runs this on 1F1B, fill-drain and interleaved schedules when its Linear fast
// path is on: the weight gradients of all micro-batches then run as one fused product per
// layer, and the upstream stages get their gradients sooner (a B becomes the shorter I).
// The executor runs, and the simulator predicts, the rewritten schedule, so the measured and
// the predicted bubble describe the same thing.
#pragma once

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// Each `backward` becomes `backward_input`; the matching `backward_weight` actions are added,
// in the order the backwards ran, right before the stage's first step action (or at the end
// of an inference-free list without one). Slots are reassigned and the result is validated.
// A schedule that already splits its backwards, or has none, is returned unchanged.
Schedule defer_weight_gradients(const Schedule& schedule);

}  // namespace pipetrain::schedule
