// The ZB-V compute order (Qi et al., 2024): two chunks per stage in a V, 1F1B's memory.
//
// Chunk 0 descends the stages and chunk 1 climbs back, so stage 0 holds both the first and
// the last virtual stage: a micro-batch's backward starts on the stage that started its
// forward, and every stage sees the same amount of work at both ends of the step. Stage j
// of P runs, with N = max(M, 2P - 1) micro-batches (steps of micro-batches >= M are dropped,
// which keeps the order valid for any M):
//
//   warm-up   2(P-j)-1 x  F(chunk 0)
//                   j x  F(chunk 1) F(chunk 0)
//                 P-j x  F(chunk 1) I(chunk 1) W(chunk 1)
//   steady    until both chunks have forwarded all N:
//                        [F(chunk 0) while any is left] I(chunk 0) W(chunk 0)
//                        F(chunk 1) I(chunk 1) W(chunk 1)
//   cool-down       j x  I(chunk 0) I(chunk 1)
//                 P-j x  I(chunk 0) W(chunk 0)
//                        the deferred W(chunk 1), then the deferred W(chunk 0)
//
// At most 2P chunk activations (P whole-stage ones, as 1F1B's stage 0) are live on a stage;
// with F = B = W the bubble is never above ZB-H1's (both property-tested). The regular steady
// state keeps the order good when the real costs differ from the equal ones it assumes.
#include <algorithm>

#include "pipetrain/schedule/generate.h"

namespace pipetrain::schedule {

ComputeOrder zb_v_order(int num_stages, int num_micro_batches) {
  const int P = num_stages;
  const int M = num_micro_batches;
  const int N = std::max(M, 2 * P - 1);
  ComputeOrder order(P);
  for (int j = 0; j < P; ++j) {
    auto& steps = order[j];
    steps.reserve(6 * static_cast<size_t>(M));
    int forward[2] = {0, 0};
    int input[2] = {0, 0};
    int weight[2] = {0, 0};
    auto run = [&](Op op, int chunk) {
      int& next = op == Op::forward          ? forward[chunk]
                  : op == Op::backward_input ? input[chunk]
                                             : weight[chunk];
      if (next < M) steps.push_back({op, chunk, next});
      ++next;
    };
    for (int k = 0; k < 2 * (P - j) - 1; ++k) run(Op::forward, 0);
    for (int k = 0; k < j; ++k) {
      run(Op::forward, 1);
      run(Op::forward, 0);
    }
    for (int k = 0; k < P - j; ++k) {
      run(Op::forward, 1);
      run(Op::backward_input, 1);
      run(Op::backward_weight, 1);
    }
    while (forward[1] < forward[0] || forward[0] < N) {
      if (forward[0] < N) run(Op::forward, 0);
      run(Op::backward_input, 0);
      run(Op::backward_weight, 0);
      run(Op::forward, 1);
      run(Op::backward_input, 1);
      run(Op::backward_weight, 1);
    }
    for (int k = 0; k < j; ++k) {
      run(Op::backward_input, 0);
      run(Op::backward_input, 1);
    }
    for (int k = 0; k < P - j; ++k) {
      run(Op::backward_input, 0);
      run(Op::backward_weight, 0);
    }
    while (weight[1] < N) run(Op::backward_weight, 1);
    while (weight[0] < N) run(Op::backward_weight, 0);
  }
  return order;
}

}  // namespace pipetrain::schedule
