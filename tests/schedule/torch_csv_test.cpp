// torch.distributed.pipelining's schedule CSV: hand-written files in torch's format, round
// trips of every kind, and the errors a malformed cell gets.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>

#include "pipetrain/error.h"
#include "pipetrain/schedule/format.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/torch_csv.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

const std::string kFixtures = std::string(PIPETRAIN_SOURCE_DIR) + "/tests/fixtures/torch_csv/";

// The same actions, slots, buffers and layout: what the executor sees (the kind differs:
// a schedule read from a file is "custom").
void expect_same_schedule(const Schedule& a, const Schedule& b) {
  EXPECT_EQ(a.layout.num_stages(), b.layout.num_stages());
  EXPECT_EQ(a.layout.num_chunks(), b.layout.num_chunks());
  // With one stage both layouts place the chunks alike; the file cannot tell them apart.
  if (a.num_stages() > 1) {
    EXPECT_EQ(a.layout.kind(), b.layout.kind());
  }
  EXPECT_EQ(a.num_micro_batches, b.num_micro_batches);
  EXPECT_EQ(a.training, b.training);
  EXPECT_EQ(a.buffers, b.buffers);
  EXPECT_EQ(format_text(a).substr(format_text(a).find('\n')),
            format_text(b).substr(format_text(b).find('\n')));
}

std::string message_of(const std::string& text) {
  try {
    from_torch_csv(text, "test.csv");
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TorchCsv, ReadsTorchsOneFOneBWithIdleCells) {
  const Schedule s = read_torch_csv(kFixtures + "1f1b_p2_m4.csv");
  EXPECT_EQ(s.kind, ScheduleKind::custom);
  EXPECT_EQ(s.layout.kind(), LayoutKind::looped);
  expect_same_schedule(s, generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 4)));
}

TEST(TorchCsv, ReadsInterleavedStagesAsLoopedChunks) {
  // Rank r holds torch's stages r and r + 2: our chunks 0 and 1 in the looped layout.
  const Schedule s = read_torch_csv(kFixtures + "interleaved_p2_v2_m4.csv");
  EXPECT_EQ(s.num_chunks(), 2);
  EXPECT_EQ(s.layout.kind(), LayoutKind::looped);
  expect_same_schedule(s, generate(ScheduleOptions(ScheduleKind::interleaved, 2, 4).chunks(2)));
}

TEST(TorchCsv, ChecksCommunicationCellsAndKeepsOurPlacement) {
  const Schedule s = read_torch_csv(kFixtures + "zb_p2_m2_with_comm.csv");
  // clang-format off
  EXPECT_EQ(format_compute_table(s),
            "stage 0: F0 F1 I0 W0 I1 W1\n"
            "stage 1: F0 I0 F1 I1 W0 W1\n");
  // clang-format on
  // The file receives both activations up front; we receive each right before its forward.
  EXPECT_EQ(to_string(s.stages[1][0]), "1RA0#0<0");
  EXPECT_EQ(to_string(s.stages[1][2]), "1F0#0");
  // Written back with communication: the lowering's placement, torch's cell names.
  EXPECT_EQ(to_torch_csv(s, true),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0W0,0RECV_B1,0I1,0W1\n"
            "1RECV_F0,1F0,1I0,1SEND_B0,1RECV_F1,1F1,1I1,1SEND_B1,1W0,1W1\n");
}

TEST(TorchCsv, MalformedFileNamesRowColumnAndCell) {
  try {
    read_torch_csv(kFixtures + "malformed.csv");
    FAIL() << "expected ScheduleError";
  } catch (const ScheduleError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("malformed.csv: row 1 (rank 1), column 1, cell '1X0': unknown action "
                        "type 'X0'"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("e.g. 0F1"), std::string::npos) << what;
  }
  EXPECT_THROW(read_torch_csv(kFixtures + "no_such_file.csv"), ConfigError);
}

TEST(TorchCsv, MalformedCells) {
  EXPECT_NE(message_of("0F0,F1\n").find("row 0 (rank 0), column 1, cell 'F1': 'F1' does not "
                                        "start with a stage index"),
            std::string::npos);
  EXPECT_NE(message_of("0F0,0F\n").find("cell '0F': F needs a micro-batch index"),
            std::string::npos);
  EXPECT_NE(message_of("0F0,0F1x\n").find("unexpected 'x' after the micro-batch"),
            std::string::npos);
  EXPECT_NE(message_of("(0F0;0SEND_F0)OVERLAP_F_B\n")
                .find("OVERLAP_F_B may only hold compute actions"),
            std::string::npos);
  EXPECT_NE(message_of("\"0F0\n").find("a double quote opens a cell that never closes"),
            std::string::npos);
  EXPECT_NE(message_of("").find("no rows"), std::string::npos);
  EXPECT_NE(message_of("0F0,2F0\n1F0\n").find("3 stages (0..2) do not split evenly over 2 ranks"),
            std::string::npos);
  // Stage 1 on rank 0 of 2 ranks: neither layout puts it there.
  EXPECT_NE(message_of("0F0,1F0\n2F0,3F0\n").find("do not follow a layout"), std::string::npos);
  // A transfer the compute order has no use for, and one missing.
  EXPECT_NE(message_of("0F0,0SEND_F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n")
                .find("column 2, cell '0SEND_F0': rank 0 has no such transfer"),
            std::string::npos);
  EXPECT_NE(message_of("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0\n").find("lacks the transfer"),
            std::string::npos);
  EXPECT_NE(message_of("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n")
                .find("a receive must come before the compute action of stage 1"),
            std::string::npos);
  // An order that cannot run: the validator's message.
  EXPECT_NE(message_of("0B0,0F0\n1F0,1B0\n").find("cannot run here"), std::string::npos);
}

TEST(TorchCsv, OverlappedPairsAndDroppedStepsParse) {
  // DualPipeV's (F;B)OVERLAP_F_B cells run forward then backward; FSDP and reduce steps drop.
  const Schedule s = from_torch_csv(
      "0UNSHARD,0F0,0F1,,0B0,(0F2;0B1)OVERLAP_F_B,0F3,0B2,0B3,0REDUCE_GRAD\n"
      ",1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3,\n");
  expect_same_schedule(s, generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 4)));
}

TEST(TorchCsv, VShapedStagesReadAsTheV) {
  // zb-v on 2 stages: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2; the hand-over 1 -> 2
  // stays on rank 1 and has no cell.
  const Schedule zb_v = generate(ScheduleOptions(ScheduleKind::zb_v, 2, 3));
  const std::string csv = to_torch_csv(zb_v, true);
  EXPECT_EQ(csv.find("1SEND_F"), std::string::npos) << csv;
  EXPECT_EQ(csv.find("2RECV_F"), std::string::npos) << csv;
  expect_same_schedule(from_torch_csv(csv), zb_v);
  // A local hand-over written anyway is accepted and dropped.
  std::string with_local = csv;
  with_local.insert(with_local.find("2F0"), "2RECV_F0,");
  expect_same_schedule(from_torch_csv(with_local), zb_v);
}

struct Kind {
  ScheduleKind kind;
  int chunks;
};

// Ours -> CSV -> ours gives the same schedule, compute-only and with communication.
RC_GTEST_PROP(TorchCsvProperty, RoundTripsEveryKind, ()) {
  const Kind k = *rc::gen::element(
      Kind{ScheduleKind::fill_drain, 1}, Kind{ScheduleKind::one_f_one_b, 1},
      Kind{ScheduleKind::inference, 1}, Kind{ScheduleKind::interleaved, 3},
      Kind{ScheduleKind::zb_h1, 1}, Kind{ScheduleKind::zb_v, 2}, Kind{ScheduleKind::dualpipe_v, 2},
      Kind{ScheduleKind::v_half, 2}, Kind{ScheduleKind::v_min, 2});
  const int P = *rc::gen::inRange(1, 9);
  int M = *rc::gen::inRange(1, 25);
  if (k.kind == ScheduleKind::dualpipe_v) M = std::max(M, 2 * P);
  const Schedule s = generate(ScheduleOptions(k.kind, P, M).chunks(k.chunks));
  for (bool with_comm : {false, true}) {
    const Schedule back = from_torch_csv(to_torch_csv(s, with_comm));
    RC_ASSERT(back.num_micro_batches == s.num_micro_batches);
    RC_ASSERT(back.num_chunks() == s.num_chunks());
    RC_ASSERT(P == 1 || back.layout == s.layout);
    RC_ASSERT(back.training == s.training);
    RC_ASSERT(back.stages == s.stages);
    RC_ASSERT(back.buffers == s.buffers);
  }
}

}  // namespace
}  // namespace pipetrain::schedule
