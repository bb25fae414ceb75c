// `pipetrain schedule` and `pipetrain simulate`: output formats, files and argument errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli_runner.h"

namespace pipetrain::apps {
namespace {

using testing::CliRun;
using testing::run;

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string temp_path(const std::string& name) {
  return std::string(PIPETRAIN_BINARY_DIR) + "/tests/" + name;
}

TEST(ScheduleCommand, PrintsOneLinePerStage) {
  const CliRun r = run({"schedule", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "1f1b: 2 stages, 2 micro-batches, 1 chunk(s) per stage (looped layout); buffers per "
            "stage: 2 1\n"
            "stage 0: 0L0#0 0F0#0 0SA0#0>1 0L1#1 0F1#1 0SA1#1>1 0RG0#0<1 0B0#0 0RG1#1<1 0B1#1 "
            "0T 0R 0O\n"
            "stage 1: 1RA0#0<0 1L0#0 1F0#0 1B0#0 1SG0#0>0 1RA1#0<0 1L1#0 1F1#0 1B1#0 1SG1#0>0 "
            "1T 1R 1O\n");
}

TEST(ScheduleCommand, JsonHasAStagesArrayOfActionObjects) {
  const CliRun r = run({"schedule", "--kind", "interleaved", "--stages", "2", "--micro-batches",
                        "4", "--chunks", "2", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["stages"].size(), 2u);
  EXPECT_EQ(json["num_chunks"], 2);
  int forwards = 0;
  for (const auto& a : json["stages"][1]) {
    ASSERT_TRUE(a.contains("op") && a.contains("chunk"));
    if (a["op"] == "forward") {
      ++forwards;
      EXPECT_TRUE(a.contains("mb"));
    }
    if (a["op"] == "optimizer_step") {
      EXPECT_FALSE(a.contains("mb"));
    }
  }
  EXPECT_EQ(forwards, 8);
}

TEST(ScheduleCommand, StageSelectsOneStage) {
  const CliRun text =
      run({"schedule", "--kind", "zb-h1", "--stages", "4", "--micro-batches", "8", "--stage", "3"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out.find("stage 0:"), std::string::npos);
  EXPECT_NE(text.out.find("\nstage 3: 3RA0#0<2 3L0#0 3F0#0 3I0#0"), std::string::npos) << text.out;
  const CliRun json = run({"schedule", "--kind", "zb-h1", "--stages", "4", "--micro-batches", "8",
                           "--stage", "3", "--format", "json"});
  const auto parsed = nlohmann::json::parse(json.out);
  EXPECT_TRUE(parsed["stages"][0].empty());
  EXPECT_FALSE(parsed["stages"][3].empty());
}

TEST(ScheduleCommand, BadArgumentsGiveOneLineAndUsage) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"schedule", "--stages", "2", "--micro-batches", "2"}, "--kind needs a value"},
      {{"schedule", "--kind", "gpipe", "--stages", "2", "--micro-batches", "2"},
       "unknown schedule kind 'gpipe'"},
      {{"schedule", "--kind", "1f1b", "--stages", "0", "--micro-batches", "2"},
       "--stages expects the number of pipeline stages P (an integer >= 1), got '0'"},
      {{"schedule", "--kind", "1f1b", "--stages", "2", "--micro-batches", "two"},
       "--micro-batches expects the number of micro-batches M (an integer >= 1), got 'two'"},
      {{"schedule", "--kind", "1f1b", "--stages", "2"}, "--micro-batches needs a value"},
      {{"schedule", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--chunks", "2"},
       "use --kind interleaved"},
      {{"schedule", "--kind", "zb-v", "--stages", "2", "--micro-batches", "2", "--chunks", "4"},
       "use --chunks 2"},
      {{"schedule", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--stage", "5"},
       "--stage 5 is outside the 2 stages"},
      {{"schedule", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--format", "xml"},
       "--format expects text, json or csv, got 'xml'"},
      {{"schedule", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--with-comm"},
       "--with-comm only applies to --format csv"},
      {{"schedule", "--kind", "dualpipev", "--stages", "4", "--micro-batches", "6"},
       "dualpipev needs at least 2P = 8 micro-batches for 4 stages"},
      {{"schedule", "--from-csv", "x.csv", "--stages", "2"},
       "--from-csv takes stages, chunks, micro-batches and layout from the file: drop --stages 2"},
      {{"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--format", "csv"},
       "simulate prints text or json"},
      {{"schedule", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--colour"},
       "unknown argument '--colour'"},
      {{"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--cost-comm", "-1"},
       "--cost-comm expects a cost (a number >= 0), got '-1'"},
      {{"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--svg"},
       "--svg needs a FILE"},
      {{"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--cores", "-2"},
       "--cores expects a number of cores >= 0 (0: one per stage), got '-2'"},
      {{"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--cores", "1", "--shared-efficiency",
        "1.5"},
       "--shared-efficiency expects a fraction in (0, 1], got '1.5'"},
  };
  for (const auto& [args, words] : cases) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << words;
    EXPECT_TRUE(r.out.empty()) << r.out;
    const std::string first = r.err.substr(0, r.err.find('\n'));
    EXPECT_EQ(first.rfind("pipetrain " + args[0] + ": error: ", 0), 0u) << r.err;
    EXPECT_NE(first.find(words), std::string::npos) << r.err;
    const std::string second = r.err.substr(r.err.find('\n') + 1);
    EXPECT_EQ(second.rfind("usage: pipetrain " + args[0] + " --kind ", 0), 0u) << r.err;
  }
}

TEST(ScheduleCommand, SimulateOnSharedCores) {
  // SharedCores.FourRanksOnTwoCoresIdleWhileThePipelineFillsAndDrains from the command line:
  // 15 on two cores as on a core each (never more than two ranks have work), where the bound
  // "work over the cores" says 12; on one core, all 24 units of work back to back.
  const std::vector<std::string> base{"simulate",        "--kind", "1f1b", "--stages",        "4",
                                      "--micro-batches", "2",      "--cost-backward", "2", "--cost-weight",
                                      "0"};
  auto with = [&base](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return run(more);
  };
  const CliRun dedicated = with({"--format", "json"});
  ASSERT_EQ(dedicated.code, 0) << dedicated.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(dedicated.out)["makespan"].get<double>(), 15);
  const CliRun shared = with({"--cores", "2", "--format", "json"});
  ASSERT_EQ(shared.code, 0) << shared.err;
  const auto parsed = nlohmann::json::parse(shared.out);
  EXPECT_DOUBLE_EQ(parsed["makespan"].get<double>(), 15);
  EXPECT_DOUBLE_EQ(parsed["cores"].get<double>(), 2);
  const CliRun one = with({"--cores", "1", "--format", "json"});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(one.out)["makespan"].get<double>(), 24);
  const CliRun text = with({"--cores", "2", "--shared-efficiency", "0.5"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("the ranks share 2 cores (switching efficiency 0.5)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("makespan: 15\n"), std::string::npos) << text.out;
}

TEST(ScheduleCommand, TorchCsvOutAndBackIn) {
  // The contract: dualpipev as torch's CSV, read back by simulate.
  const CliRun csv = run({"schedule", "--kind", "dualpipev", "--stages", "4", "--micro-batches", "8",
                          "--format", "csv"});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(csv.out.substr(0, csv.out.find('\n')),
            "0F0,0F1,0F2,0F3,0F4,0F5,0F6,7F0,7I0,7W0,7F1,7I1,7W1,7F2,7I2,7W2,7F3,0F7,7B3,7F4,0B0,"
            "7B4,7F5,0B1,7B5,7F6,0B2,7B6,7F7,0B3,7B7,0I4,0W4,0I5,0W5,0I6,0W6,0I7,0W7");
  const std::string path = temp_path("schedule_command_test_dualpipev.csv");
  {
    std::ofstream out(path);
    out << csv.out;
  }
  const CliRun sim = run({"simulate", "--from-csv", path});
  ASSERT_EQ(sim.code, 0) << sim.err;
  const CliRun generated = run({"simulate", "--kind", "dualpipev", "--stages", "4", "--micro-batches", "8"});
  // The same figures; only the header names the kind (custom, read from a file) differently.
  EXPECT_EQ(sim.out.substr(0, sim.out.find('\n')),
            "custom: 4 stages, 8 micro-batches, 2 chunk(s) per stage (v_shape layout)");
  EXPECT_EQ(sim.out.substr(sim.out.find('\n')), generated.out.substr(generated.out.find('\n')));
  const CliRun comm = run({"schedule", "--from-csv", path, "--format", "csv", "--with-comm"});
  ASSERT_EQ(comm.code, 0) << comm.err;
  EXPECT_NE(comm.out.find("0SEND_F0,"), std::string::npos) << comm.out;
  const CliRun missing = run({"simulate", "--from-csv", temp_path("no_such_schedule.csv")});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("cannot open the file"), std::string::npos) << missing.err;
}

TEST(SimulateCommand, PrintsMakespanBubbleAndPeakMemory) {
  const CliRun r = run({"simulate", "--kind", "1f1b", "--stages", "4", "--micro-batches", "8"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "1f1b: 4 stages, 8 micro-batches, 1 chunk(s) per stage\n"
            "costs per stage: forward 1, backward_input 1, backward_weight 1 (full backward 2), "
            "transfer 0\n"
            "makespan: 33\n"
            "stage  busy        bubble   peak live activations  buffers\n"
            "0      24           27.27%  4                      4\n"
            "1      24           27.27%  3                      3\n"
            "2      24           27.27%  2                      2\n"
            "3      24           27.27%  1                      1\n"
            "overall bubble: 27.27%\n");
}

TEST(SimulateCommand, CostsJsonSvgAndTrace) {
  const std::string svg = temp_path("simulate_command_test.svg");
  const std::string trace = temp_path("simulate_command_test.json");
  std::remove(svg.c_str());
  std::remove(trace.c_str());
  const CliRun r =
      run({"simulate", "--kind",         "zb-v", "--stages",        "2",    "--micro-batches",
           "4",        "--cost-forward", "2",    "--cost-backward", "2",    "--cost-weight",
           "2",        "--cost-comm",    "0",    "--format",        "json", "--svg",
           svg,        "--trace",        trace});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(json["makespan"].get<double>(), 25);  // 24 units of work + 1 idle
  EXPECT_NEAR(json["bubble"].get<double>(), 0.04, 1e-12);
  EXPECT_EQ(json["costs"]["backward_weight"], 2.0);
  ASSERT_EQ(json["stages"].size(), 2u);
  EXPECT_EQ(json["stages"][0]["peak_activation_memory"], 2.0);
  const std::string drawing = read(svg);
  EXPECT_NE(drawing.find("zb-v: P=2 stages, M=4 micro-batches, V=2, bubble 4.0%"),
            std::string::npos);
  const auto events = nlohmann::json::parse(read(trace))["traceEvents"];
  EXPECT_GT(events.size(), 48u);
}

TEST(SimulateCommand, SendCostsDeferredWeightsAndFilledWaits) {
  // 1F1B, 2 stages, 1 micro-batch, F = 1, B + W = 2: each of the two sends adds 0.25.
  CliRun r = run({"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "1", "--cost-send", "0.25",
                  "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(json["makespan"].get<double>(), 6.5);
  EXPECT_EQ(json["costs"]["send"], 0.25);
  // 2 micro-batches as the engine runs them (simulate_test.cpp works the timeline out): the
  // deferred W0 fills stage 0's wait for its last gradient.
  r = run({"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--defer-weights", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(r.out)["makespan"].get<double>(), 8);
  r = run({"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2", "--defer-weights", "--fill-waits"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("makespan: 7\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("waits filled with queued weight-gradient work"), std::string::npos) << r.out;
}

TEST(SimulateCommand, UnwritableFileIsAnErrorWithoutUsage) {
  const CliRun r = run({"simulate", "--kind", "1f1b", "--stages", "2", "--micro-batches", "2",
                        "--trace", "/nonexistent-dir/trace.json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--trace /nonexistent-dir/trace.json: cannot write the file"),
            std::string::npos);
  EXPECT_EQ(r.err.find("usage:"), std::string::npos);
}

TEST(SimulateCommand, SpawnedBinaryExitsNonZeroOnBadArguments) {
  const std::string command = std::string(PIPETRAIN_CLI_PATH) +
                              " simulate --kind 1f1b --stages 2 --micro-batches 0 2>/dev/null";
  const int status = std::system(command.c_str());
  EXPECT_NE(status, 0);
}

}  // namespace
}  // namespace pipetrain::apps
