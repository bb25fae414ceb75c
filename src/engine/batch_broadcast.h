// One rank of a tensor-parallel group reads the micro-batches and the others receive them (as
// Megatron's broadcast_data): the group needs them all, and a data set read T times costs T
// times the I/O and may not even give the same rows twice.
#pragma once

#include <vector>

#include <string>

#include "pipetrain/batch/data_iterator.h"
#include "pipetrain/comm/group.h"

namespace pipetrain::detail {

// Collective over `group`. The member `root` (a global rank; `is_root` there) sends `batches`;
// elsewhere the argument is ignored and the root's arrive. `root_error` on the root (its read
// failed): every member throws DataError, the root with that message, the others naming it.
std::vector<MicroBatch> broadcast_micro_batches(comm::Group& group, int root, bool is_root,
                                                std::vector<MicroBatch> batches, const std::string& root_error = "");

}  // namespace pipetrain::detail
