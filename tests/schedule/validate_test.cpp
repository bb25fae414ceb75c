// The validator rejects hand-written wrong schedules, naming stage, position and action.
#include "pipetrain/schedule/validate.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"
#include "pipetrain/schedule/format.h"

namespace pipetrain::schedule {
namespace {

Schedule hand(int P, int M, std::vector<int> buffers, const std::vector<std::string>& rows,
              bool training = true, int V = 1, LayoutKind layout = LayoutKind::looped) {
  Schedule s;
  s.kind = ScheduleKind::custom;
  s.training = training;
  s.num_micro_batches = M;
  s.layout = Layout(P, V, layout);
  s.buffers = std::move(buffers);
  for (const auto& row : rows) s.stages.push_back(parse_actions(row));
  return s;
}

// Two stages, one micro-batch: the smallest pipelined training step.
const char* kStage0 = "0L0#0 0F0#0 0SA0#0>1 0RG0#0<1 0B0#0 0T 0R 0O";
const char* kStage1 = "1RA0#0<0 1L0#0 1F0#0 1B0#0 1SG0#0>0 1T 1R 1O";

// Expects a problem at (stage, position) whose reason contains `words`.
void expect_problem(const Schedule& s, int stage, int position, const std::string& words) {
  const auto problem = find_problem(s);
  ASSERT_TRUE(problem.has_value()) << format_text(s);
  EXPECT_EQ(problem->stage, stage) << problem->reason;
  EXPECT_EQ(problem->position, position) << problem->reason;
  EXPECT_NE(problem->reason.find(words), std::string::npos) << problem->reason;
  try {
    validate(s);
    ADD_FAILURE() << "validate() accepted it";
  } catch (const ScheduleError& e) {
    EXPECT_EQ(e.what(), describe_problem(s, *problem));
  }
}

TEST(Validate, AcceptsTheHandWrittenBaseline) {
  EXPECT_FALSE(find_problem(hand(2, 1, {1, 1}, {kStage0, kStage1})).has_value());
}

TEST(Validate, MissingRecvBeforeForward) {
  const Schedule s = hand(2, 1, {1, 1}, {kStage0, "1L0#0 1F0#0 1B0#0 1SG0#0>0 1T 1R 1O"});
  expect_problem(s, 1, 1, "forward of micro-batch 0 before its input arrived: no recv_activation");
}

TEST(Validate, DoubleForward) {
  const Schedule s =
      hand(2, 1, {1, 1}, {"0L0#0 0F0#0 0F0#0 0SA0#0>1 0RG0#0<1 0B0#0 0T 0R 0O", kStage1});
  expect_problem(s, 0, 2, "second forward of micro-batch 0 (the first is at position 1)");
}

TEST(Validate, BackwardBeforeForward) {
  const Schedule s = hand(2, 1, {1, 1}, {kStage0, "1RA0#0<0 1L0#0 1B0#0 1F0#0 1SG0#0>0 1T 1R 1O"});
  expect_problem(s, 1, 2, "backward of micro-batch 0 before its forward");
}

TEST(Validate, SlotOverwrittenWhileStillNeeded) {
  const Schedule s =
      hand(2, 2, {1, 1},
           {"0L0#0 0F0#0 0SA0#0>1 0L1#0 0F1#0 0SA1#0>1 0RG0#0<1 0B0#0 0RG1#0<1 0B1#0 0T 0R 0O",
            "1RA0#0<0 1L0#0 1F0#0 1B0#0 1SG0#0>0 1RA1#0<0 1L1#0 1F1#0 1B1#0 1SG1#0>0 1T 1R 1O"});
  expect_problem(s, 0, 3,
                 "overwrites slot 0, which still holds micro-batch 0: its last use is position 7 "
                 "(0B0#0)");
  EXPECT_EQ(find_problem(s)->related, (std::vector<std::pair<int, int>>{{0, 7}}));
}

TEST(Validate, DeadlockCycleBetweenTwoStages) {
  // Stage 0 waits for the gradient before sending the activation that produces it.
  const Schedule s = hand(2, 1, {1, 1}, {"0L0#0 0F0#0 0RG0#0<1 0SA0#0>1 0B0#0 0T 0R 0O", kStage1});
  expect_problem(s, 0, 2, "deadlock, a cycle of 2 stage(s)");
  const auto problem = find_problem(s);
  EXPECT_NE(problem->reason.find("stage 0 is blocked at position 2 on 0RG0#0<1, which waits for "
                                 "1SG0#0>0 at stage 1 position 4; stage 1 is blocked at position "
                                 "0 on 1RA0#0<0, which waits for 0SA0#0>1 at stage 0 position 3"),
            std::string::npos)
      << problem->reason;
  EXPECT_EQ(problem->related, (std::vector<std::pair<int, int>>{{1, 0}}));
}

TEST(Validate, DeadlockOnALocalHandOver) {
  // One stage, two looped chunks: chunk 1 receives from chunk 0 before chunk 0 has sent.
  const Schedule s =
      hand(1, 1, {2},
           {"0L0#0 0F0#0 0RA0c1#1<0 0SA0#0>0c1 0L0c1#1 0F0c1#1 0B0c1#1 0SG0c1#1>0 0RG0#0<0c1 0B0#0 "
            "0T 0R 0O"},
           true, 2);
  expect_problem(s, 0, 2, "deadlock, a cycle of 1 stage(s)");
  EXPECT_NE(find_problem(s)->reason.find("the send comes later on the blocked stage itself"),
            std::string::npos);
}

TEST(Validate, UnmatchedSend) {
  const Schedule s = hand(
      2, 2, {1, 1}, {"0L0#0 0F0#0 0SA0#0>1 0L1#0 0F1#0 0SA1#0>1", "1RA0#0<0 1L0#0 1F0#0"}, false);
  expect_problem(
      s, 0, 5, "unmatched send: stage 1 never runs the matching recv_activation of micro-batch 1");
}

TEST(Validate, ReceiveOfAMessageNeverSent) {
  const Schedule s = hand(
      2, 2, {1, 1}, {"0L0#0 0F0#0 0SA0#0>1", "1RA0#0<0 1L0#0 1F0#0 1RA1#0<0 1L1#0 1F1#0"}, false);
  expect_problem(s, 1, 3, "waits for a message never sent: stage 0 has no send_activation");
}

TEST(Validate, PeerMustBeTheLayoutsNeighbour) {
  const Schedule s = hand(2, 1, {1, 1}, {"0L0#0 0F0#0 0SA0#0>0 0RG0#0<1 0B0#0 0T 0R 0O", kStage1});
  expect_problem(s, 0, 2, "peer is stage 0 chunk 0, but virtual stage 1 lives on stage 1 chunk 0");
}

TEST(Validate, OnlyFirstAndLastVirtualStagesLoad) {
  const Schedule s = hand(
      3, 1, {1, 1, 1},
      {"0L0#0 0F0#0 0SA0#0>1", "1RA0#0<0 1L0#0 1F0#0 1SA0#0>2", "2RA0#0<1 2L0#0 2F0#0"}, false);
  expect_problem(s, 1, 1, "only the first (inputs) and the last (labels) virtual stage load data");
}

TEST(Validate, LoadsInIncreasingMicroBatchOrder) {
  const Schedule s = hand(1, 2, {1}, {"0L1#0 0F1#0 0L0#0 0F0#0"}, false);
  expect_problem(s, 0, 2, "loads micro-batch 0 after micro-batch 1");
}

TEST(Validate, ForwardOnTheFirstStageNeedsItsLoad) {
  const Schedule s = hand(1, 1, {1}, {"0F0#0"}, false);
  expect_problem(s, 0, 0, "before its load_micro_batch (it needs the inputs)");
}

TEST(Validate, StepActionsComeAfterAllBackwardWorkAndInOrder) {
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0T 0B0#0 0R 0O"}), 0, 2,
                 "reduce_tied_grads before the backward of micro-batch 0 is done");
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0B0#0 0R 0T 0O"}), 0, 3,
                 "reduce_grads before reduce_tied_grads");
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0B0#0 0T 0R"}), 0, -1, "missing: optimizer_step");
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0B0#0 0T 0R 0O 0O"}), 0, 6, "second optimizer_step");
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0I0#0 0T 0R 0O"}), 0, 3,
                 "reduce_tied_grads before the backward of micro-batch 0 is done");
}

TEST(Validate, SplitBackwardRules) {
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0I0#0 0B0#0 0T 0R 0O"}), 0, 3,
                 "backward of micro-batch 0 after a backward_input");
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0W0#0 0I0#0 0T 0R 0O"}), 0, 2,
                 "backward_weight of micro-batch 0 before its backward_input");
  EXPECT_FALSE(find_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0I0#0 0W0#0 0T 0R 0O"})).has_value());
}

TEST(Validate, SendGradBeforeTheBackwardThatComputesIt) {
  const Schedule s = hand(2, 1, {1, 1}, {kStage0, "1RA0#0<0 1L0#0 1F0#0 1SG0#0>0 1B0#0 1T 1R 1O"});
  expect_problem(s, 1, 3, "send_grad of micro-batch 0 before the backward that computes it");
}

TEST(Validate, SlotsAndStagesInRange) {
  expect_problem(hand(1, 1, {1}, {"0L0#3 0F0#3 0B0#3 0T 0R 0O"}), 0, 0,
                 "slot 3, but the stage has 1 buffer(s)");
  expect_problem(hand(1, 1, {1}, {"0L0 0F0 0B0 0T 0R 0O"}), 0, 0, "no buffer slot assigned");
  expect_problem(hand(2, 1, {1, 1}, {"0L0#0 1F0#0", kStage1}), 0, 1,
                 "listed on stage 0 but names stage 1");
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0B0#0 0L1#0 0T 0R 0O"}), 0, 3,
                 "micro-batch 1, but the schedule has 1");
  expect_problem(hand(1, 1, {1}, {"0L0c1#0 0T 0R 0O"}), 0, 0, "chunk 1, but the schedule has 1");
  EXPECT_EQ(find_problem(hand(2, 1, {1}, {kStage0, kStage1}))->stage, -1);
}

TEST(Validate, InferenceHasNoBackwardOrStep) {
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0B0#0"}, false), 0, 2,
                 "an inference schedule has no backward");
  expect_problem(hand(1, 1, {1}, {"0L0#0 0F0#0 0O"}, false), 0, 2,
                 "an inference schedule has no reduce or optimizer actions");
}

TEST(Validate, EveryMicroBatchIsForwardedOnEveryStage) {
  expect_problem(hand(1, 2, {1}, {"0L0#0 0F0#0"}, false), 0, -1,
                 "micro-batch 1 is never forwarded");
}

TEST(Validate, ReportMarksTheActionInTheGrid) {
  const Schedule s = hand(2, 1, {1, 1}, {kStage0, "1L0#0 1F0#0 1B0#0 1SG0#0>0 1T 1R 1O"});
  EXPECT_EQ(describe_problem(s, *find_problem(s)),
            "invalid custom schedule (2 stages, 1 micro-batches, 1 chunk(s) per stage): stage 1, "
            "position 1, action 1F0#0: forward of micro-batch 0 before its input arrived: no "
            "recv_activation earlier on this stage\n"
            "position     0     1       2        3        4     5  6  7\n"
            "stage 0      0L0#0 0F0#0   0SA0#0>1 0RG0#0<1 0B0#0 0T 0R 0O\n"
            "stage 1      1L0#0 [1F0#0] 1B0#0    1SG0#0>0 1T    1R 1O\n"
            "                   ^^^^^^^\n");
}

TEST(Validate, LongGridsShowAWindowAroundTheMark) {
  std::string row = "0L0#0 0F0#0 0B0#0";
  for (int i = 1; i < 30; ++i) {
    const std::string n = std::to_string(i);
    row += " 0L" + n + "#0 0F" + n + "#0 0B" + n + "#0";
  }
  row += " 0F29#0 0T 0R 0O";
  const Schedule s = hand(1, 30, {1}, {row});
  const std::string text = describe_problem(s, *find_problem(s));
  EXPECT_NE(text.find("[0F29#0]"), std::string::npos) << text;
  EXPECT_NE(text.find("position ..."), std::string::npos) << text;
  EXPECT_EQ(text.find("0L0#0 "), std::string::npos) << text;
}

}  // namespace
}  // namespace pipetrain::schedule
