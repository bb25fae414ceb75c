// The DualPipeV compute order (DeepSeek-V3's DualPipe cut in half, as torch's ScheduleDualPipeV).
//
// Two chunks per stage in a V (chunk 0 = virtual stage j descending, chunk 1 = 2P-1-j climbing
// back), so every stage starts and ends micro-batches. DualPipe's point is its main phase:
// each step pairs the forward of one chunk with the full backward of the other, which a
// runtime with two streams overlaps (compute of one hides the communication of the other);
// our executor runs the pair one after the other, forward first, as torch's lowering orders
// the pair's sub-actions. Stage j of P, with M >= 2P micro-batches (torch demands the same):
//
//   1  2(P-j-1) x  F0                      warm-up of chunk 0
//   2      j+1  x  F0 F1                    the V fills; chunk 1 starts
//   3    P-j-1  x  I1 W F1                  zero-bubble steps: W = the oldest queued weight grad
//   4  M-2P+j+1 x  (F0 B1) (F1 B0)          the overlapped main phase (full backwards)
//   5    P-j-1  x  B1 (F1 B0)
//   6      j+1  x  B1 B0  -> I1 I0 from the middle on (odd j: one step earlier for chunk 1)
//   7    P-j-1  x  W B0   (I0 once step 6 switched to split backwards)
//   8      j+1  x  W                        the queued weight gradients
//
// (F0 = forward of chunk 0, B1 = full backward of chunk 1, I/W its two halves.) Counting per
// chunk gives exactly M forwards and M backwards on every stage. Peak: at most 2P + 1 chunk
// activations per stage (property-tested), one more than ZB-V's and 1F1B's 2P: the price of
// holding the forward of the pair while its backward runs.
#include <deque>
#include <utility>

#include "pipetrain/schedule/generate.h"

namespace pipetrain::schedule {

ComputeOrder dualpipe_v_order(int num_stages, int num_micro_batches) {
  const int P = num_stages;
  const int M = num_micro_batches;
  ComputeOrder order(P);
  for (int j = 0; j < P; ++j) {
    auto& steps = order[j];
    steps.reserve(6 * static_cast<size_t>(M));
    int forward[2] = {0, 0};
    int backward[2] = {0, 0};               // full backwards and input halves alike
    std::deque<std::pair<int, int>> queued;  // (chunk, micro-batch) waiting for its W
    auto F = [&](int chunk) { steps.push_back({Op::forward, chunk, forward[chunk]++}); };
    auto B = [&](int chunk, bool split) {
      const int i = backward[chunk]++;
      steps.push_back({split ? Op::backward_input : Op::backward, chunk, i});
      if (split) queued.emplace_back(chunk, i);
    };
    auto W = [&] {
      if (queued.empty()) return;
      steps.push_back({Op::backward_weight, queued.front().first, queued.front().second});
      queued.pop_front();
    };
    for (int k = 0; k < 2 * (P - j - 1); ++k) F(0);
    for (int k = 0; k < j + 1; ++k) {
      F(0);
      F(1);
    }
    for (int k = 0; k < P - j - 1; ++k) {
      B(1, true);
      W();
      F(1);
    }
    for (int k = 0; k < M - 2 * P + j + 1; ++k) {
      F(0);
      B(1, false);
      F(1);
      B(0, false);
    }
    for (int k = 0; k < P - j - 1; ++k) {
      B(1, false);
      F(1);
      B(0, false);
    }
    // The second half of the cool-down splits its backwards, so the weight gradients can
    // fill the bubble while the last input gradients drain towards stage 0.
    const int pairs = j + 1;
    bool split = false;
    for (int k = 0; k < pairs; ++k) {
      if (k == pairs / 2 && j % 2 == 1) split = true;
      B(1, split);
      if (k == pairs / 2 && j % 2 == 0) split = true;
      B(0, split);
    }
    for (int k = 0; k < P - j - 1; ++k) {
      W();
      B(0, split);
    }
    for (int k = 0; k < j + 1; ++k) W();
    while (!queued.empty()) W();
  }
  return order;
}

}  // namespace pipetrain::schedule
