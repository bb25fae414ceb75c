// Activation checkpointing: run a function keeping only its inputs, recompute it in backward.
//
//   forward:   inputs ──► [CheckpointFunction] ──► outputs      fn runs under no_grad;
//                  │ saved: inputs, RNG state                    nothing inside fn is kept
//   backward:  grad(outputs) ──► restore RNG ──► fn(detached inputs) with grad ──► backward
//                               through the recomputed graph ──► grad(inputs), parameter grads
//
// The node is a custom autograd Function, so the surrounding graph runs straight through it;
// the recomputation's own backward is a nested (re-entrant) backward pass, and checkpoints
// inside checkpoints work. A zero-size "phony" input that requires grad keeps the node in the
// graph even when no input requires grad (the first partition's input), so the parameters used
// by fn still get their gradients.
//
// RNG: when a task generator is installed (runtime/rng.h; GPipe does this per task), its state
// is copied at forward and installed again for the recomputation, which therefore draws exactly
// the same numbers whatever other threads do. Otherwise the default generators' states are
// captured at forward and restored around the recomputation (torch.utils.checkpoint's rule),
// which reproduces the draws only if no other thread drew in between.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace pipetrain::runtime {

using Tensors = std::vector<torch::Tensor>;

// Runs fn(inputs) keeping only the inputs; backward recomputes fn under the RNG state captured at
// forward (dropout masks identical) and back-propagates through it. Non-floating inputs/outputs
// (masks, ids) get no gradient. Nested use works. With grad mode off this is just fn(inputs).
Tensors checkpointed_forward(const std::function<Tensors(const Tensors&)>& fn,
                             const Tensors& inputs);

// true inside fn during the first (no-grad) forward of a checkpoint
bool is_checkpointing();
// true inside fn during recomputation in backward
bool is_recomputing();

}  // namespace pipetrain::runtime

namespace pipetrain {
using runtime::is_checkpointing;
using runtime::is_recomputing;
}  // namespace pipetrain
