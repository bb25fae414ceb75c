// The compact action notation prints, parses back and rejects malformed text.
#include "pipetrain/schedule/action.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain::schedule {
namespace {

Action make(Op op, int stage, int mb, int chunk = 0, int slot = -1, int peer = -1,
            int peer_chunk = -1) {
  Action a;
  a.op = op;
  a.stage = stage;
  a.micro_batch = mb;
  a.chunk = chunk;
  a.slot = slot;
  a.peer_stage = peer;
  a.peer_chunk = peer_chunk;
  return a;
}

TEST(Action, PrintsTheDocumentedExamples) {
  EXPECT_EQ(to_string(make(Op::forward, 2, 5)), "2F5");
  EXPECT_EQ(to_string(make(Op::backward_input, 1, 3, 1, 2)), "1I3c1#2");
  EXPECT_EQ(to_string(make(Op::send_activation, 0, 4, 0, 1, 1, 0)), "0SA4#1>1");
  EXPECT_EQ(to_string(make(Op::recv_grad, 3, 0, 1, 0, 0, 1)), "3RG0c1#0<0c1");
  EXPECT_EQ(to_string(make(Op::optimizer_step, 2, -1)), "2O");
  EXPECT_EQ(to_string(make(Op::reduce_tied_grads, 0, -1)), "0T");
  EXPECT_EQ(to_string(make(Op::reduce_grads, 11, -1)), "11R");
  EXPECT_EQ(to_string(make(Op::load_micro_batch, 0, 12, 0, 3)), "0L12#3");
  EXPECT_EQ(to_string(make(Op::backward_weight, 7, 63, 1, 15)), "7W63c1#15");
  EXPECT_EQ(to_string(make(Op::backward, 0, 0)), "0B0");
  EXPECT_EQ(to_string(make(Op::send_grad, 2, 1, 0, 0, 1, 0)), "2SG1#0>1");
  EXPECT_EQ(to_string(make(Op::recv_activation, 1, 9, 0, 4, 0, 0)), "1RA9#4<0");
}

TEST(Action, StoredOpIndicesAreChecked) {
  EXPECT_EQ(op_from_index(0), Op::load_micro_batch);
  EXPECT_EQ(op_from_index(kNumOps - 1), Op::optimizer_step);
  for (int bad : {-1, kNumOps, 255}) {
    try {
      op_from_index(bad);
      FAIL() << bad;
    } catch (const ScheduleError& e) {
      EXPECT_NE(std::string(e.what()).find("op index " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  // Printing an action of no known op names it as unknown instead of reading past the table.
  const Action odd = make(static_cast<Op>(kNumOps + 3), 1, 2);
  EXPECT_EQ(std::string(op_name(odd.op)), "unknown");
  EXPECT_EQ(to_string(odd), "1?2");
  EXPECT_EQ(malformation(odd), "unknown op");
}

TEST(Action, ParsesEveryField) {
  EXPECT_EQ(parse_action("2F5"), make(Op::forward, 2, 5));
  EXPECT_EQ(parse_action("3RG0c1#0<0c1"), make(Op::recv_grad, 3, 0, 1, 0, 0, 1));
  EXPECT_EQ(parse_action("0SA4#1>1"), make(Op::send_activation, 0, 4, 0, 1, 1, 0));
  EXPECT_EQ(parse_action("12O"), make(Op::optimizer_step, 12, -1));
  const auto row = parse_actions("  0L0#0 0F0#0\t0SA0#0>1\n0T ");
  ASSERT_EQ(row.size(), 4u);
  EXPECT_EQ(row[2], make(Op::send_activation, 0, 0, 0, 0, 1, 0));
}

TEST(Action, RejectsMalformedTextNamingIt) {
  for (const char* bad : {"", "F5", "2X5", "2F", "2Fx", "2F5c", "2F5#", "2SA5>", "2SA5<1", "2RA5>1",
                          "2F5>1", "2O3", "2F5 ", "2F5c1#2>3", "2F1234567890"}) {
    try {
      parse_action(bad);
      ADD_FAILURE() << "parsed '" << bad << "'";
    } catch (const ScheduleError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("e.g. 2F5"), std::string::npos) << e.what();
    }
  }
}

TEST(Action, NamesAndCodesAreDistinctAndRoundTrip) {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    EXPECT_EQ(parse_op_name(op_name(op)), op);
    for (int k = 0; k < i; ++k) {
      EXPECT_STRNE(op_code(op), op_code(static_cast<Op>(k)));
      EXPECT_STRNE(op_name(op), op_name(static_cast<Op>(k)));
    }
  }
  EXPECT_THROW(parse_op_name("forwards"), ScheduleError);
}

TEST(Action, MalformationExplainsTheField) {
  EXPECT_EQ(malformation(make(Op::forward, 0, 1)), "");
  EXPECT_NE(malformation(make(Op::forward, 0, -1)).find("needs a micro-batch"), std::string::npos);
  EXPECT_NE(malformation(make(Op::optimizer_step, 0, 2)).find("takes no micro-batch"),
            std::string::npos);
  EXPECT_NE(malformation(make(Op::send_grad, 0, 1)).find("needs a peer"), std::string::npos);
  EXPECT_NE(malformation(make(Op::forward, 0, 1, 0, 0, 1, 0)).find("takes no peer"),
            std::string::npos);
  EXPECT_NE(malformation(make(Op::forward, -1, 1)).find("negative stage"), std::string::npos);
}

TEST(Action, ShortLabelDropsStageSlotAndPeer) {
  EXPECT_EQ(short_label(parse_action("3RG0c1#0<0c1")), "RG0c1");
  EXPECT_EQ(short_label(parse_action("2F5#3")), "F5");
  EXPECT_EQ(short_label(parse_action("2O")), "O");
}

// Any well-formed action: a micro-batch exactly on the ops that have one, a peer exactly on
// sends and receives.
rc::Gen<Action> well_formed_action() {
  return rc::gen::exec([] {
    Action a;
    a.op = static_cast<Op>(*rc::gen::inRange(0, kNumOps));
    a.stage = *rc::gen::inRange(0, 100000);
    a.chunk = *rc::gen::inRange(0, 64);
    if (has_micro_batch(a.op)) {
      a.micro_batch = *rc::gen::inRange(0, 1000000);
      a.slot = *rc::gen::inRange(-1, 5000);
    }
    if (is_comm(a.op)) {
      a.peer_stage = *rc::gen::inRange(0, 100000);
      a.peer_chunk = *rc::gen::inRange(0, 64);
    }
    return a;
  });
}

RC_GTEST_PROP(ActionProperty, ParseOfPrintIsIdentity, ()) {
  const Action a = *well_formed_action();
  RC_ASSERT(malformation(a).empty());
  RC_ASSERT(parse_action(to_string(a)) == a);
}

}  // namespace
}  // namespace pipetrain::schedule
