// torch.distributed.pipelining's schedule CSV (`_PipelineSchedule._dump_csv` / `_load_csv`):
// write ours, read theirs.
//
// One row per rank (= our stage), one cell per action, in execution order; an empty cell is
// an idle step. A cell is torch's `_Action` text: <stage><type>[<micro-batch>], where the
// stage is the GLOBAL (virtual) stage index 0 .. P*V-1, not the rank:
//
//   type         ours                        type          ours (with communication)
//   F            forward                     SEND_F        send_activation of that stage
//   B            backward (full)             RECV_F        recv_activation into that stage
//   I            backward_input              SEND_B        send_grad of that stage
//   W            backward_weight             RECV_B        recv_grad into that stage
//   (a;b)OVERLAP_F_B   a then b (DualPipeV's overlapped pair; we run them in order)
//   UNSHARD, RESHARD, REDUCE_GRAD   FSDP and gradient-reduction steps: read and dropped
//
//   rank 0:  0F0,0F1,0F2,0F3,0B0,...        (1F1B, P = 2)
//   rank 0:  0F0,0SEND_F0,0F1,...,1RECV_B0,0B0,...   (the same with communication)
//
// Reading infers P (rows), V (largest stage index + 1, divided by P), M (largest micro-batch
// + 1) and the layout (stage s on rank s % P: looped; the V of layout.h: v_shape), lowers the
// compute order as every generator does (loads, sends, receives, slots, step actions) and
// validates the result. Communication cells are checked against that lowering (the same
// transfers, each receive before the compute that consumes it and each send after the one
// that produces it); the lowering's own placement (receive right before, send right after)
// is kept. Transfers between two chunks on one rank have no cell (torch hands them over
// locally, as we do); one found in a file is accepted and dropped.
#pragma once

#include <string>
#include <string_view>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// One row per stage, cells separated by commas, rows ended by '\n'. Compute actions only,
// or with the cross-rank sends and receives too (torch's "compute_comms" format). Loads and
// the step actions (T R O) have no torch equivalent and are left out.
std::string to_torch_csv(const Schedule& schedule, bool with_comm = false);

// Parses torch's CSV (compute-only or with communication) into a validated custom-kind
// Schedule. `origin` names the source in messages (a file name). Throws ScheduleError naming
// row (rank), column and cell for a malformed cell, a stage index that fits no layout, a
// communication cell our lowering does not have, or (validate()'s message) an order that
// cannot run.
Schedule from_torch_csv(std::string_view text, std::string_view origin = "torch CSV");

// from_torch_csv of a file's contents; ConfigError when the file cannot be read.
Schedule read_torch_csv(const std::string& path);

}  // namespace pipetrain::schedule
