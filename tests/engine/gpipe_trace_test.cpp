// A GPipe step's timeline: every task recorded on its partition's row, in the clock's order,
// rendered as a Chrome trace, and its bubble measured beside the simulator's (counts and
// orderings only: no assumption about how long anything takes).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/error.h"

namespace pipetrain {
namespace {

using schedule::Op;

TEST(GPipeTrace, AStepRecordsEveryTaskOnItsPartitionInTheClocksOrder) {
  torch::manual_seed(21);
  GPipe gpipe(testing::mlp6(), GPipeOptions({3, 3}).chunks(4).checkpoint(Checkpoint::Never));
  EXPECT_THROW(gpipe->last_step_bubble(), UsageError);
  gpipe->forward(torch::randn({8, 8})).sum().backward();
  const auto events = gpipe->last_step_events();
  std::map<std::pair<int, Op>, std::vector<int>> order;  // (partition, op) -> micro-batches in start order
  std::vector<schedule::TimedEvent> sorted = events;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  std::map<int, double> forward_end;
  for (const auto& e : sorted) {
    EXPECT_LE(e.start, e.end);
    order[{e.stage, e.op}].push_back(e.micro_batch);
    if (e.op == Op::forward) forward_end[e.stage] = std::max(forward_end[e.stage], e.end);
  }
  for (int j : {0, 1}) {
    const std::vector<int> forwards{0, 1, 2, 3}, backwards{3, 2, 1, 0}, weights{-1};
    EXPECT_EQ(order[std::make_pair(j, Op::forward)], forwards) << "partition " << j;
    EXPECT_EQ(order[std::make_pair(j, Op::backward)], backwards) << "partition " << j;
    // Every Linear of the partition took the fast path: one weight-gradient task per step.
    EXPECT_EQ(order[std::make_pair(j, Op::backward_weight)], weights) << "partition " << j;
  }
  EXPECT_EQ(events.size(), 2u * 4 + 2u * 4 + 2u);
  // The clock: a partition's forward of a micro-batch starts after the one before it ended.
  for (const auto& e : events) {
    if (e.op != Op::forward || e.stage != 1) continue;
    for (const auto& d : events) {
      if (d.op == Op::forward && d.stage == 0 && d.micro_batch == e.micro_batch) {
        EXPECT_GE(e.start, d.end);
      }
    }
  }
  // Backwards follow forwards, the caller's time between them taken out.
  for (const auto& e : events) {
    if (e.op == Op::backward) {
      EXPECT_GE(e.start, forward_end[1] - 1e-9);
    }
  }
  const auto bubble = gpipe->last_step_bubble();
  EXPECT_GE(bubble.measured, 0.0);
  EXPECT_LT(bubble.measured, 1.0);
  EXPECT_GT(bubble.simulated, 0.0);  // fill-drain over 2 partitions always idles some
  EXPECT_LT(bubble.simulated, 1.0);
  const std::string trace = gpipe->chrome_trace();
  for (const char* needle : {"\"traceEvents\"", "partition 0", "partition 1", "\"F0\"", "\"B3\""}) {
    EXPECT_NE(trace.find(needle), std::string::npos) << needle;
  }
}

TEST(GPipeTrace, AnEvalStepHasForwardsOnlyAndTheInferenceSchedulesBubble) {
  GPipe gpipe(testing::mlp6(), GPipeOptions({2, 2, 2}).chunks(3));
  gpipe->eval();
  torch::NoGradGuard no_grad;
  gpipe->forward(torch::randn({6, 8}));
  const auto events = gpipe->last_step_events();
  EXPECT_EQ(events.size(), 9u);
  for (const auto& e : events) EXPECT_EQ(e.op, Op::forward);
  const auto bubble = gpipe->last_step_bubble();
  EXPECT_GT(bubble.simulated, 0.0);
  EXPECT_LT(bubble.simulated, 1.0);
}

}  // namespace
}  // namespace pipetrain
