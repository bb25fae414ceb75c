// The planner's machine constants: what one local message, one step's fixed work and the
// engine's compute cost here, measured once on this machine (docs/planner.md: how) and
// overridable through the environment for another machine.
//
//   PIPETRAIN_PLAN_LATENCY_US   per-message latency between two local ranks (Gloo over loopback)
//   PIPETRAIN_PLAN_BANDWIDTH_MBS  bytes per second between them, in MB/s
//   PIPETRAIN_PLAN_SEND_US      time posting one send keeps its sender
//   PIPETRAIN_PLAN_ALLREDUCE_MBS  a gradient all-reduce's bus bandwidth between replicas, MB/s
//   PIPETRAIN_PLAN_OVERHEAD_MS  per step, outside the pipeline (loss/norm all-reduce, barrier)
//   PIPETRAIN_PLAN_COMPUTE_SCALE  engine compute time / profiled compute time
//   PIPETRAIN_PLAN_SHARED_EFFICIENCY  with more ranks than cores, the share of a busy core's time
//                               that does profiled work while the ranks outnumber the cores
//   PIPETRAIN_PLAN_SHARED_MESSAGE_US  with more ranks than cores, the CPU time one message costs
//                               its two ranks
//   PIPETRAIN_PLAN_STREAM_MBS   an optimizer step's bytes through memory per second (default:
//                               measured by `plan` beside the other ranks' work)
#pragma once

#include "pipetrain/schedule/plan.h"

namespace pipetrain::apps {

struct Calibration {
  schedule::LinkModel link;
  double step_overhead_s = 0;
  double compute_scale = 1;
  double shared_efficiency = 1;  // PlanSearchOptions::shared_efficiency
  double shared_message_s = 0;   // PlanSearchOptions::shared_message_s
};

// The constants measured here, with any environment override applied (ConfigError for a
// malformed value).
Calibration calibration();

// Bytes per second an SGD-like update (a += s * b over tensors larger than this machine's
// caches: 3 bytes through memory per byte of a) streams on this thread now; or
// PIPETRAIN_PLAN_STREAM_MBS when set. Median of a few passes over 2 x 64 MiB.
double stream_bytes_per_s();

}  // namespace pipetrain::apps
