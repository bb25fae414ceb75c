// The controllable-memory V orders V-Half and V-Min (Qi et al. 2024, "Pipeline Parallelism
// with Controllable Memory"), built by a greedy placement instead of the paper's hand-made
// building blocks.
//
// The paper's observation: in a V every micro-batch's activation on a stage lives from its
// forward to its weight gradient, and a stage's peak memory is that lifespan divided by the
// interval at which new micro-batches enter. 1F1B / ZB-V let chunk-0 activations on stage 0
// live through the whole pipeline fill (2P chunk activations = 1F1B's P whole stages);
// starting micro-batches only as fast as the V drains them shortens the lifespans:
//
//   V-ZB    ~2P chunk activations per stage (1F1B's memory), no bubble
//   V-Half  ~P                               (half),       little bubble
//   V-Min   ~2P/3                            (a third),    more bubble: the V is never full
//
// Our construction (honest, not the paper's exact blocks): replay the V in unit time steps
// (F, I and W of one chunk take 1 each, transfers are free). Stage 0 starts micro-batch i no
// earlier than step i * interval (6 = a stage's whole work per micro-batch keeps the V full
// without piling micro-batches up). At each step each stage runs one ready op, in this
// priority:
//
//   1. I, chunk 1 before chunk 0 (frees memory, feeds the previous virtual stage);
//   2. F of chunk 1 (a micro-batch already admitted on this stage);
//   3. F of chunk 0, only while the stage holds fewer than `admit_below` chunk activations
//      (forward done, W not yet);
//   4. W, the older first: the bubble filler, and what a stage at its threshold runs to
//      make room (or, with eager_weights, right after the Is: shortest lifespans).
//
// Chunk-1 forwards are never held back (the micro-batch holding the stage's memory needs them
// to finish), so the threshold alone does not bound the peak. The replay cannot stall: the
// oldest unfinished micro-batch is never blocked (what fills a stage is older and finishes
// first, and W needs nothing). bounded_v_order() then scans thresholds and intervals and
// keeps the fastest replay whose peak is within the kind's bound -- a hard guarantee:
//
//   v-half  at most max(2, P) chunk activations per stage           (1F1B: 2P)
//   v-min   at most max(2, ceil(2P/3)) chunk activations per stage
//
// (2 is the floor: the turn of the V holds one micro-batch's two chunks at once.) The price
// is bubble, which the greedy pays more than the paper's hand-placed blocks, most for small
// P (see docs/schedule.md for measured figures).
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "pipetrain/error.h"
#include "pipetrain/schedule/generate.h"

namespace pipetrain::schedule {
namespace {

constexpr int kNotYet = -1;

// Times at which each (virtual stage, micro-batch) finished its F and its I; kNotYet before.
struct Finished {
  Finished(int virtual_stages, int micro_batches)
      : forward(static_cast<size_t>(virtual_stages) * micro_batches, kNotYet),
        input(forward),
        micro_batches_(micro_batches) {}
  int& f(int v, int i) { return forward[static_cast<size_t>(v) * micro_batches_ + i]; }
  int& b(int v, int i) { return input[static_cast<size_t>(v) * micro_batches_ + i]; }
  // Finished strictly before step t (a result is usable the step after it ends).
  static bool before(int finished, int t) { return finished != kNotYet && finished <= t; }

  std::vector<int> forward, input;
  int micro_batches_;
};

}  // namespace

CappedOrder capped_v_order(int num_stages, int num_micro_batches, int admit_below, int interval,
                           bool eager_weights) {
  const int P = num_stages;
  const int M = num_micro_batches;
  const int last = 2 * P - 1;
  const Layout layout(P, 2, LayoutKind::v_shape);
  Finished done(2 * P, M);
  // Per stage and chunk: the next micro-batch of each op (each runs in micro-batch order).
  struct Next {
    int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
  };
  std::vector<Next> next(static_cast<size_t>(P));
  std::vector<int> live(static_cast<size_t>(P), 0);
  ComputeOrder order(P);
  for (auto& steps : order) steps.reserve(6 * static_cast<size_t>(M));
  const long total = 6L * P * M;
  long placed = 0;
  int idle_steps = 0;
  int t = 0;
  for (; placed < total; ++t) {
    bool progress = false;
    for (int j = 0; j < P; ++j) {
      Next& n = next[static_cast<size_t>(j)];
      auto forward_ready = [&](int chunk) {
        const int i = n.f[chunk];
        if (i >= M) return false;
        const int v = layout.virtual_stage(j, chunk);
        return v == 0 || Finished::before(done.f(v - 1, i), t);
      };
      auto input_ready = [&](int chunk) {
        const int i = n.b[chunk];
        if (i >= M || i >= n.f[chunk]) return false;
        const int v = layout.virtual_stage(j, chunk);
        if (!Finished::before(done.f(v, i), t)) return false;
        return v == last || Finished::before(done.b(v + 1, i), t);
      };
      auto weight_ready = [&](int chunk) {
        const int i = n.w[chunk];
        return i < n.b[chunk] && Finished::before(done.b(layout.virtual_stage(j, chunk), i), t);
      };
      ComputeStep step{Op::forward, -1, -1};
      auto pick_weight = [&] {
        // The older W first, so the activation held longest goes first.
        const bool w0 = weight_ready(0), w1 = weight_ready(1);
        if (w0 && (!w1 || n.w[0] <= n.w[1])) step = {Op::backward_weight, 0, n.w[0]};
        else if (w1) step = {Op::backward_weight, 1, n.w[1]};
        return step.chunk >= 0;
      };
      if (input_ready(1)) {
        step = {Op::backward_input, 1, n.b[1]};
      } else if (input_ready(0)) {
        step = {Op::backward_input, 0, n.b[0]};
      } else if (eager_weights && pick_weight()) {
      } else if (forward_ready(1)) {
        step = {Op::forward, 1, n.f[1]};
      } else if (forward_ready(0) && live[static_cast<size_t>(j)] < admit_below &&
                 (j > 0 || t >= interval * n.f[0])) {
        step = {Op::forward, 0, n.f[0]};
      } else {
        pick_weight();
      }
      if (step.chunk < 0) continue;
      const int v = layout.virtual_stage(j, step.chunk);
      switch (step.op) {
        case Op::forward:
          done.f(v, step.micro_batch) = t + 1;
          ++n.f[step.chunk];
          ++live[static_cast<size_t>(j)];
          break;
        case Op::backward_input:
          done.b(v, step.micro_batch) = t + 1;
          ++n.b[step.chunk];
          break;
        default:
          ++n.w[step.chunk];
          --live[static_cast<size_t>(j)];
          break;
      }
      order[static_cast<size_t>(j)].push_back(step);
      ++placed;
      progress = true;
    }
    // Some stage can always run something within 2P steps of stage 0's next release (see
    // the comment at the top); more means a broken invariant, not a slow schedule.
    idle_steps = progress ? 0 : idle_steps + 1;
    if (idle_steps > 2 * P + 2 + interval)
      throw ScheduleError(fmt::format(
          "capped_v_order: no stage could run anything for {} steps ({} stages, {} "
          "micro-batches, cap {}): the greedy placement stalled, please report this",
          idle_steps, P, M, admit_below));
  }
  return {std::move(order), t};
}

int peak_chunk_activations(const ComputeOrder& order) {
  int peak = 0;
  for (const auto& steps : order) {
    int live = 0;
    for (const ComputeStep& step : steps) {
      if (step.op == Op::forward) peak = std::max(peak, ++live);
      if (step.op == Op::backward_weight) --live;
    }
  }
  return peak;
}

// Over admission thresholds, release intervals and both W policies, the order that finishes first (in the
// replay's unit steps) among those within `bound` chunk activations per stage. The peak is not
// monotone in the threshold (a lower one can let chunk-1 work pile up), hence the full scan.
// Threshold 1 always fits a bound of 2: a stage then admits a micro-batch only when it holds
// nothing, so it holds at most that micro-batch's two chunks.
static ComputeOrder bounded_v_order(int num_stages, int num_micro_batches, int bound) {
  bound = std::max(2, bound);
  std::optional<CappedOrder> best;
  for (bool eager : {false, true}) {
  for (int interval : {6, 7, 8, 9, 10, 12}) {
    for (int admit = 1; admit <= bound + num_stages; ++admit) {
      CappedOrder candidate =
          capped_v_order(num_stages, num_micro_batches, admit, interval, eager);
      if (peak_chunk_activations(candidate.order) > bound) continue;
      if (!best || candidate.steps < best->steps) best = std::move(candidate);
    }
  }
  }
  return std::move(best->order);
}

// Half of 1F1B's 2P chunk activations per stage. The cap needs at least 2: the turn of the
// V holds a micro-batch's chunk-0 and chunk-1 activations at once.
ComputeOrder v_half_order(int num_stages, int num_micro_batches) {
  return bounded_v_order(num_stages, num_micro_batches, num_stages);
}

// A third of 1F1B's: ceil(2P / 3) chunk activations, at least 2.
ComputeOrder v_min_order(int num_stages, int num_micro_batches) {
  return bounded_v_order(num_stages, num_micro_batches, (2 * num_stages + 2) / 3);
}

}  // namespace pipetrain::schedule
