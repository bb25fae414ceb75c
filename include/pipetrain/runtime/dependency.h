// Fork/join: an explicit backward-order dependency between two micro-batches (torchgpipe's
// dependency.py).
//
//   partition j's output for i-1 ──Fork──► (same values) ──► partition j+1 ...
//                                    └── phony ──┐
//   partition j's input for i ───────────────── Join ──► (same values) ──► partition j
//
// In backward, Fork waits for the phony's gradient, which Join sends once the gradient for
// partition j's input of micro-batch i exists; so partition j runs the backward of micro-batch
// i before that of i-1, in reverse order of the forward. On CUDA this keeps each device's
// backward in pipeline order; on CPU autograd runs everything on one thread and the order does
// not matter, so the pipeline only inserts it for non-CPU devices (runtime/device.h's rule: CPU
// is the no-op case). The functions themselves work on any device and are tested on CPU.
#pragma once

#include <torch/torch.h>

#include <utility>

#include "pipetrain/batch/batch.h"

namespace pipetrain::runtime {

// (input with the same values, phony): the phony is a zero-size tensor that requires grad when
// the input does.
std::pair<torch::Tensor, torch::Tensor> fork(const torch::Tensor& input);
// The input with the same values; in backward it also sends a gradient to `phony`.
torch::Tensor join(const torch::Tensor& input, const torch::Tensor& phony);

// Makes the backward of `fork_from` wait for that of `join_to`, through their first floating
// tensors (nothing when grad mode is off or `fork_from` has none that requires grad).
void depend(Batch& fork_from, Batch& join_to);

}  // namespace pipetrain::runtime
