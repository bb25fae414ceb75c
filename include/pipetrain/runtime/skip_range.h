// Running a range of layers on one micro-batch with its skips, checkpointed or not.
//
// Plain: the micro-batch's tracker is installed while the layers run; they stash into it and
// pop from it, and autograd follows the skipped tensors like any other.
//
// Checkpointed: only the range's inputs are kept, so the tensors it pops from earlier layers
// become extra inputs of the checkpoint and the tensors it stashes for later layers extra
// outputs. Gradients then reach the stashing layers through the checkpoint's backward, and the
// recomputation stashes and pops inside the range again on a tracker of its own:
//
//   tracker ──pops_in──►┐                         ┌──stashes_out──► tracker
//   input   ───────────►[ checkpoint(fn: layers) ]──────────────────► output
//
// An undefined skip tensor (an optional skip) is neither an input nor an output of the
// checkpoint: which skips were present is recorded at forward, and a recomputation that
// stashes differently is a ModuleError naming the layer and the skip.
#pragma once

#include <functional>

#include "pipetrain/batch/batch.h"
#include "pipetrain/skip/plan.h"

namespace pipetrain::runtime {

// Runs the layers on a batch (under whatever tracker is installed).
using RangeRunner = std::function<Batch(const Batch& input)>;

// Runs layers [first, last) (model indices) through `run`. Pops of earlier stashes come from
// `tracker`; stashes for later layers are left in it. ModuleError when a layer of the range
// does not stash what its declaration promises.
Batch run_with_skips(const skip::SkipPlan& plan, int64_t first, int64_t last, const Batch& input,
                     skip::SkipTracker& tracker, bool checkpoint, const RangeRunner& run);

}  // namespace pipetrain::runtime
