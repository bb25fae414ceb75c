// Printing schedules: text listing, JSON, compute tables and the step-by-stage grid.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// A header line, then one line per stage: "stage 0: 0L0#0 0F0#0 0SA0#0>1 ...".
// only_stage >= 0 prints that stage alone.
std::string format_text(const Schedule& schedule, int only_stage = -1);

// One JSON object:
//   {"kind": "1f1b", "training": true, "num_stages": P, "num_micro_batches": M,
//    "num_chunks": V, "layout": "looped", "virtual_stages": [[v of chunk 0, ...] per stage],
//    "buffers": [per stage], "stages": [[{"op": "forward", "stage": 0, "mb": 0, "chunk": 0,
//    "slot": 0}, ...] per stage]}
// "mb" and "slot" only where the op has them, "peer_stage"/"peer_chunk" on sends and
// receives. only_stage >= 0 leaves every other stage's array empty (the index stays the stage).
// pretty: one key and one action per line; otherwise all on one line.
std::string to_json(const Schedule& schedule, int only_stage = -1, bool pretty = true);

// The compute steps alone, one row per stage, columns aligned (used by the golden tests):
//   stage 0:  F0  F1  B0  F2  B1  B2
std::string format_compute_table(const Schedule& schedule);

// Stages as rows, list positions as columns; the (stage, position) pairs in `marks` are
// bracketed and underlined. Shows the columns around the first mark (all when there is none,
// up to `max_columns`).
std::string format_grid(const Schedule& schedule,
                        const std::vector<std::pair<int, int>>& marks = {}, int max_columns = 17);

}  // namespace pipetrain::schedule
