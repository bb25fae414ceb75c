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
// RNG: every random op repeats its draws on recomputation, as torchgpipe's RNG-state restore
// does. runtime::Dropout draws from the thread's task generator (runtime/rng.h), whose state is
// copied at forward and installed again for the recomputation. Every other op (torch::dropout,
// torch::rand, a Dropout nested in a custom module) draws from the default generators, whose
// states are captured at forward and restored around the recomputation under a
// DefaultGeneratorLease, so no other thread draws in between. A thread whose draws nothing
// else covers (no lease held, no FreeOfDrawsScope) leases the default generator for the
// checkpointed forward too.
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
