// The ZB-V compute order: a greedy list schedule over the V-shaped layout at unit costs.
//
// Two chunks per stage, chunk 0 descending and chunk 1 ascending, so stage 0 holds both the
// first and the last virtual stage and the backward of a micro-batch starts on the stage that
// started its forward. The order is what a stage would do at each tick if forward,
// backward_input and backward_weight each took one tick and transfers none, choosing
//
//   1. backward_input, oldest micro-batch first (it is on the critical path: the previous
//      virtual stage waits for its gradient);
//   2. forward, chunk 1 before chunk 0 (a micro-batch on its way up reaches its loss sooner
//      and frees memory sooner), while fewer than 2 min(P, M) chunk activations are live
//      (forward done, backward_weight not done: 1F1B's peak memory, each chunk being half a
//      stage); chunk 0 leaves one of them free, so an upward micro-batch can always proceed;
//   3. backward_weight, oldest first: it fills what would otherwise be a bubble.
//
// Stage 0 thus runs 2P-1 chunk-0 forwards before its first chunk-1 forward, as the ZB-V of Qi
// et al. (2024) does, and the weight-gradient steps fill the warm-up and cool-down bubbles.
#include <algorithm>
#include <deque>
#include <vector>

#include <fmt/format.h>

#include "pipetrain/error.h"
#include "pipetrain/schedule/generate.h"

namespace pipetrain::schedule {
namespace {

constexpr int kNotYet = -1;

struct StageState {
  int next_forward[2] = {0, 0};
  int next_input_grad[2] = {0, 0};
  int live = 0;
  std::deque<ComputeStep> pending_weight;
};

}  // namespace

ComputeOrder zb_v_order(int num_stages, int num_micro_batches) {
  const int P = num_stages;
  const int M = num_micro_batches;
  const Layout layout(P, 2, LayoutKind::v_shape);
  const int last = layout.num_virtual_stages() - 1;
  const int limit = 2 * std::min(P, M);
  // Tick at which (virtual stage, micro-batch)'s forward / input-gradient finished.
  std::vector<int> forward_done(static_cast<size_t>(2) * P * M, kNotYet);
  std::vector<int> input_done(forward_done.size(), kNotYet);
  auto at = [M](int v, int i) { return static_cast<size_t>(v) * M + i; };
  auto finished = [](int tick, int now) { return tick != kNotYet && tick <= now; };

  ComputeOrder order(P);
  std::vector<StageState> state(P);
  long remaining = 6L * P * M;
  for (int now = 0; remaining > 0; ++now) {
    bool started = false;
    for (int j = 0; j < P; ++j) {
      StageState& s = state[j];
      // 1. the oldest ready input-gradient
      int best_chunk = -1;
      for (int c : {1, 0}) {
        const int i = s.next_input_grad[c];
        if (i >= M) continue;
        const int v = layout.virtual_stage(j, c);
        if (!finished(forward_done[at(v, i)], now)) continue;
        if (v != last && !finished(input_done[at(v + 1, i)], now)) continue;
        if (best_chunk < 0 || i < s.next_input_grad[best_chunk]) best_chunk = c;
      }
      if (best_chunk >= 0) {
        const int c = best_chunk;
        const int i = s.next_input_grad[c]++;
        input_done[at(layout.virtual_stage(j, c), i)] = now + 1;
        order[j].push_back({Op::backward_input, c, i});
        s.pending_weight.push_back({Op::backward_weight, c, i});
        --remaining;
        started = true;
        continue;
      }
      // 2. a forward, upward chunk first, within the memory bound
      bool forwarded = false;
      for (int c : {1, 0}) {
        const int i = s.next_forward[c];
        if (i >= M) continue;
        if (s.live >= (c == 0 ? limit - 1 : limit)) continue;
        const int v = layout.virtual_stage(j, c);
        if (v != 0 && !finished(forward_done[at(v - 1, i)], now)) continue;
        ++s.next_forward[c];
        ++s.live;
        forward_done[at(v, i)] = now + 1;
        order[j].push_back({Op::forward, c, i});
        forwarded = true;
        break;
      }
      if (forwarded) {
        --remaining;
        started = true;
        continue;
      }
      // 3. a deferred weight-gradient
      if (!s.pending_weight.empty()) {
        order[j].push_back(s.pending_weight.front());
        s.pending_weight.pop_front();
        --s.live;
        --remaining;
        started = true;
      }
    }
    // Every step lasts one tick, so a tick where no stage can start anything repeats forever.
    // The rules above never get stuck (property-tested); if they did, say so loudly.
    if (!started)
      throw ScheduleError(fmt::format("zb-v: the greedy order is stuck at tick {} with {} stages "
                                      "and {} micro-batches (a bug in pipetrain)",
                                      now, P, M));
  }
  return order;
}

}  // namespace pipetrain::schedule
