// DeepSpeed's partitioned activations between pipeline stages under tensor parallelism: the T
// ranks of a stage hold the same activation (and the same input gradient), so each sends only
// its 1/T part to its peer in the next (previous) stage, and the receiving group all-gathers
// the parts. The bytes between stages drop by T; the gather stays inside a group that already
// communicates in every layer.
//
// A partitioned batch is a tuple: a header (int64: the batch kind, then per tensor its rank,
// sizes and whether it requires grad) followed by each tensor's part of its flattened values,
// padded to a multiple of T.
#pragma once

#include "pipetrain/batch/batch.h"
#include "pipetrain/runtime/tensor_parallel.h"

namespace pipetrain::runtime {

// This rank's parts of `batch` (the whole batch when the group has one rank).
Batch partition_for_send(const Batch& batch, const TensorParallelGroup& group);
// The batch every rank of the group sent a part of (collective over the group); tensors that
// required grad come back as leaves that do.
Batch assemble_received(const Batch& parts, const TensorParallelGroup& group);

}  // namespace pipetrain::runtime
