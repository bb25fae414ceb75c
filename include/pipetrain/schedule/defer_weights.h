// Deferring weight gradients: a schedule with full backwards becomes one with input-gradient
// backwards and the weight-gradient work batched where it costs least: in the stage's first
// cool-down wait and just before the step ops.
//
// The engine runs this on 1F1B, fill-drain and interleaved schedules when its Linear fast
// path is on: the weight gradients of all micro-batches then run as one fused product per
// layer, and the upstream stages get their gradients sooner (a B becomes the shorter I).
// The executor runs, and the simulator predicts, the rewritten schedule, so the measured and
// the predicted bubble describe the same thing.
#pragma once

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// Each `backward` becomes `backward_input`. The matching `backward_weight` actions of the
// micro-batches whose I ran before the stage's first cool-down `recv_grad` (the first one
// after its last forward) go right before that receive, where the stage would otherwise wait,
// grouped by chunk; the others follow, in the order the backwards ran, right before the
// stage's first step action. Slots are reassigned and the result is validated.
// A schedule that already splits its backwards, or has none, is returned unchanged.
Schedule defer_weight_gradients(const Schedule& schedule);

}  // namespace pipetrain::schedule
