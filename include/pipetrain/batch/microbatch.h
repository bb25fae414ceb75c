// Micro-batches: scatter a mini-batch into chunks along dim 0 and gather them back.
#pragma once

#include <cstdint>
#include <vector>

#include "pipetrain/batch/batch.h"

namespace pipetrain {

// Splits every tensor of `input` along dim 0 with torch::chunk semantics (7 rows, 4 chunks ->
// 2, 2, 2, 1; 2 rows, 4 chunks -> 2 micro-batches of 1). The parts are views. Each micro-batch
// keeps the input's kind (atomic or tuple). BatchError when a tensor is 0-dimensional, when the
// tensors of a tuple have different row counts, or when `chunks` <= 0.
std::vector<Batch> scatter(const Batch& input, int64_t chunks);

// Concatenates micro-batches along dim 0, position by position (the inverse of scatter).
// BatchError when the list is empty or the micro-batches differ in kind or size.
Batch gather(const std::vector<Batch>& parts);

}  // namespace pipetrain
