// How `pipetrain train` splits an example and cuts its step when the user gives neither:
// a pure function of measured per-layer costs (the planner's LayerCosts at each candidate
// micro-batch count) to a balance and a micro-batch count, and the one line that says why.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pipetrain/schedule/plan.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::apps {

struct SplitRequest {
  // The planner's inputs: costs by micro-batch count (each count one candidate), processes,
  // cores, link and the engine's options; the search's stage counts and kinds are not used.
  schedule::PlanSearchOptions search;
  schedule::ScheduleKind kind = schedule::ScheduleKind::one_f_one_b;
  int stages = 2;
  int chunks = 0;          // 0: the kind's own
  int64_t checkpoint = 0;  // the config's activation checkpointing (0: off)
  int64_t rows = 0;        // per step and replica: micro-batch size = rows / micro-batches
  // The largest simulated bubble a choice may have: among the candidates within it the fastest
  // predicted step wins; when none is, the fastest of all (the line says so).
  double bubble_target = 0.10;
  std::string source = "measured layer costs";  // what the costs are, for the line
};

struct SplitChoice {
  std::vector<int64_t> balance;   // layers per model part
  int micro_batches = 0;
  int64_t micro_batch_size = 0;
  std::vector<double> stage_s;    // each stage's forward + backward of one step (all its micro-batches)
  double bubble = 0;              // simulated
  double step_s = 0;              // predicted
  bool within_target = true;      // false: no candidate reached bubble_target
  std::string line;               // the summary's "split" line
};

// ConfigError when no candidate can be generated (e.g. fewer layers than model parts).
SplitChoice choose_split(const SplitRequest& request);

// "5|7": layers per model part, in virtual-stage order.
std::string format_balance(const std::vector<int64_t>& balance);

}  // namespace pipetrain::apps
