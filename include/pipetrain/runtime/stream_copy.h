// Moving a micro-batch between partitions' devices on copy streams, as torchgpipe does.
//
//   partition j-1 (compute stream)          partition j (compute stream)
//        │ x                                     ▲ y
//        └─► [copy: on copy stream of j, after ──┘ [wait: j's compute stream waits for
//             j-1's work on x; x and y recorded      the copy; backward: the copy stream
//             on the streams that use them]          waits for j's backward]
//
// Both steps are autograd functions, so the gradient takes the same way back: copied on the
// copy streams, each side waiting for the other. On the CPU every stream is the one no-op
// stream and this is a plain differentiable copy.
#pragma once

#include <c10/core/Stream.h>

#include "pipetrain/batch/batch.h"

namespace pipetrain::runtime {

// The batch on `to`'s device, copied on stream `to` after the work queued on `from` (the
// stream that produced it). Floating tensors keep their gradient path; others are copied.
Batch copy_on_stream(const Batch& batch, const c10::Stream& from, const c10::Stream& to);

// The same tensors, for use on `compute` once the work queued on `copy` is done; backward
// makes `copy` wait for `compute` in turn.
Batch wait_for_copy(const Batch& batch, const c10::Stream& copy, const c10::Stream& compute);

}  // namespace pipetrain::runtime
