// The multi-chunk compute orders in micro-batch groups: interleaved 1F1B and inference.
//
// Megatron's interleaved schedule, P = 2 stages, V = 2 chunks, M = 4 micro-batches (groups of
// P = 2; `F1c1` = forward of micro-batch 1 on local chunk 1 = virtual stage 1 * P + j):
//
//   forward sequence:   F0 F1 F0c1 F1c1 | F2 F3 F2c1 F3c1
//   backward sequence:  B0c1 B1c1 B0 B1 | B2c1 B3c1 B2 B3
//   stage 0 (warm-up 2(P-1) + (V-1)P = 4):  F0 F1 F0c1 F1c1 F2 B0c1 F3 B1c1 F2c1 B0 F3c1 B1 ...
//
// Each stage walks the forward sequence and the backward sequence in the same order: after
// the warm-up one forward, one backward; the warm-up is long enough that the first backward
// (micro-batch 0 on the last virtual stage) has arrived by then.
#include <algorithm>

#include "pipetrain/schedule/generate.h"

namespace pipetrain::schedule {
namespace {

// (chunk, micro-batch) pairs in Megatron's table order; chunks reversed for backwards.
std::vector<ComputeStep> group_sequence(int num_stages, int num_micro_batches, int num_chunks,
                                        Op op, bool reverse_chunks) {
  std::vector<ComputeStep> out;
  out.reserve(static_cast<size_t>(num_micro_batches) * num_chunks);
  const std::vector<int> groups = micro_batch_groups(num_stages, num_micro_batches);
  for (size_t g = 0; g + 1 < groups.size(); ++g) {
    for (int k = 0; k < num_chunks; ++k) {
      const int chunk = reverse_chunks ? num_chunks - 1 - k : k;
      for (int i = groups[g]; i < groups[g + 1]; ++i) out.push_back({op, chunk, i});
    }
  }
  return out;
}

}  // namespace

std::vector<int> micro_batch_groups(int num_stages, int num_micro_batches) {
  // The remainder joins the first group: the warm-up covers the first group, and every
  // group must be at least P long so that a chunk's output wraps from the last stage back
  // to stage 0 before stage 0 needs it.
  std::vector<int> starts = {0};
  int next = num_micro_batches < 2 * num_stages ? num_micro_batches
                                                : num_stages + num_micro_batches % num_stages;
  for (; next < num_micro_batches; next += num_stages) starts.push_back(next);
  starts.push_back(num_micro_batches);
  return starts;
}

ComputeOrder inference_order(const Layout& layout, int num_micro_batches) {
  const auto sequence = group_sequence(layout.num_stages(), num_micro_batches, layout.num_chunks(),
                                       Op::forward, false);
  return ComputeOrder(layout.num_stages(), sequence);
}

ComputeOrder interleaved_order(int num_stages, int num_micro_batches, int num_chunks) {
  if (num_chunks == 1) return one_f_one_b_order(num_stages, num_micro_batches);
  const auto forwards =
      group_sequence(num_stages, num_micro_batches, num_chunks, Op::forward, false);
  const auto backwards =
      group_sequence(num_stages, num_micro_batches, num_chunks, Op::backward, true);
  const int total = static_cast<int>(forwards.size());
  const std::vector<int> groups = micro_batch_groups(num_stages, num_micro_batches);
  const int group = groups[1] - groups[0];
  ComputeOrder order(num_stages);
  for (int j = 0; j < num_stages; ++j) {
    const int warmup = std::min(total, 2 * (num_stages - j - 1) + (num_chunks - 1) * group);
    auto& steps = order[j];
    steps.reserve(2 * forwards.size());
    for (int k = 0; k < warmup; ++k) steps.push_back(forwards[k]);
    for (int k = 0; k + warmup < total; ++k) {
      steps.push_back(forwards[k + warmup]);
      steps.push_back(backwards[k]);
    }
    for (int k = total - warmup; k < total; ++k) steps.push_back(backwards[k]);
  }
  return order;
}

}  // namespace pipetrain::schedule
