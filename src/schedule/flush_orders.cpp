// The one-chunk compute orders: fill-drain (GPipe), 1F1B (PipeDream-Flush) and ZB-H1.
//
// 1F1B, P = 4, M = 8 (stage j runs w = min(P-j-1, M) warm-up forwards):
//
//   stage 0:  F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7
//   stage 1:  F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7
//   stage 2:  F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7
//   stage 3:  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7
//
// ZB-H1 keeps that order with B = backward_input (I) and places each backward_weight (W)
// right after an I, stage j lagging j micro-batches behind; the j deferred Ws run after the
// last I, in the bubble 1F1B leaves while the gradients drain to stage 0. Stage j then holds
// at most w + 1 + j = P micro-batches (forward done, W not done), 1F1B's stage-0 peak.
#include <algorithm>

#include "pipetrain/schedule/generate.h"

namespace pipetrain::schedule {
namespace {

ComputeStep step(Op op, int micro_batch) { return {op, 0, micro_batch}; }

}  // namespace

ComputeOrder fill_drain_order(int num_stages, int num_micro_batches) {
  ComputeOrder order(num_stages);
  for (auto& steps : order) {
    steps.reserve(2 * static_cast<size_t>(num_micro_batches));
    for (int i = 0; i < num_micro_batches; ++i) steps.push_back(step(Op::forward, i));
    // Reverse order, as autograd runs torchgpipe's backward: the last stage starts with the
    // micro-batch it finished last.
    for (int i = num_micro_batches - 1; i >= 0; --i) steps.push_back(step(Op::backward, i));
  }
  return order;
}

ComputeOrder one_f_one_b_order(int num_stages, int num_micro_batches) {
  ComputeOrder order(num_stages);
  for (int j = 0; j < num_stages; ++j) {
    const int warmup = std::min(num_stages - j - 1, num_micro_batches);
    auto& steps = order[j];
    steps.reserve(2 * static_cast<size_t>(num_micro_batches));
    for (int i = 0; i < warmup; ++i) steps.push_back(step(Op::forward, i));
    for (int i = 0; i + warmup < num_micro_batches; ++i) {
      steps.push_back(step(Op::forward, i + warmup));
      steps.push_back(step(Op::backward, i));
    }
    for (int i = num_micro_batches - warmup; i < num_micro_batches; ++i)
      steps.push_back(step(Op::backward, i));
  }
  return order;
}

ComputeOrder zb_h1_order(int num_stages, int num_micro_batches) {
  ComputeOrder order(num_stages);
  for (int j = 0; j < num_stages; ++j) {
    const int warmup = std::min(num_stages - j - 1, num_micro_batches);
    const int lag = j;
    auto& steps = order[j];
    steps.reserve(3 * static_cast<size_t>(num_micro_batches));
    int next_weight = 0;
    auto input_grad = [&](int i) {
      steps.push_back(step(Op::backward_input, i));
      if (i - lag >= next_weight) steps.push_back(step(Op::backward_weight, next_weight++));
    };
    for (int i = 0; i < warmup; ++i) steps.push_back(step(Op::forward, i));
    for (int i = 0; i + warmup < num_micro_batches; ++i) {
      steps.push_back(step(Op::forward, i + warmup));
      input_grad(i);
    }
    for (int i = num_micro_batches - warmup; i < num_micro_batches; ++i) input_grad(i);
    while (next_weight < num_micro_batches)
      steps.push_back(step(Op::backward_weight, next_weight++));
  }
  return order;
}

}  // namespace pipetrain::schedule
