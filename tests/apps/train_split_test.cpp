// `pipetrain train`'s split: chosen from measured layer costs by default, given by --balance,
// and named in one summary line either way (checked by content, never by time).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

namespace pipetrain::apps::train_split_test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Run {
  int status = -1;
  std::string output;
};

Run cli(const std::string& args, int seconds = 150) {
  const std::string command =
      "timeout -s KILL " + std::to_string(seconds) + " " + PIPETRAIN_CLI_PATH + " " + args + " 2>&1";
  Run r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.output.append(buffer.data(), n);
  r.status = ::pclose(pipe);
  return r;
}

json last_line_json(const std::string& output) {
  std::istringstream in(output);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return json::parse(last);
}

// How many lines of `output` start with `prefix`.
int lines_starting(const std::string& output, const std::string& prefix) {
  std::istringstream in(output);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.rfind(prefix, 0) == 0;
  return n;
}

class TrainSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipetrain-split-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The default chooses the split and micro-batches from a profile, keeps the step's rows, runs
// exactly what it says, and the summary names it once.
TEST_F(TrainSplit, DefaultSplitComesFromMeasuredCostsAndIsWhatTheRanksRun) {
  const auto r = cli("train --example mlp --steps 2 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  const std::string line = s["split"].get<std::string>();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m, std::regex(R"(^split (\d+)\|(\d+) by measured layer costs \(stage times \d+/\d+ ms\), (\d+) micro-batches of (\d+): simulated bubble \d+%, )")))
      << line;
  EXPECT_EQ(s["balance"], json::array({std::stoi(m[1]), std::stoi(m[2])})) << s.dump();
  EXPECT_EQ(std::stoi(m[1]) + std::stoi(m[2]), 32);  // mlp: 16 x (Linear, ReLU)
  EXPECT_EQ(s["micro_batches"], std::stoi(m[3]));
  EXPECT_EQ(s["micro_batch_size"], std::stoi(m[4]));
  // The example's step of 8 x 32 rows stays the step.
  EXPECT_EQ(s["micro_batches"].get<int>() * s["micro_batch_size"].get<int>(), 256);
  EXPECT_EQ(lines_starting(r.output, "split             "), 1) << r.output;  // the summary's line
}

TEST_F(TrainSplit, BalanceAndMicroBatchesOverrideTheChoice) {
  const auto r = cli("train --example mlp --steps 2 --balance 10,22 --micro-batches 2 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["balance"], json::array({10, 22}));
  EXPECT_EQ(s["micro_batches"], 2);
  EXPECT_EQ(s["split"], "split 10|22 given by --balance, 2 micro-batches of 32");
  EXPECT_EQ(lines_starting(r.output, "split             split 10|22 given by --balance"), 1) << r.output;

  // --micro-batches alone: the split is still chosen, for that count.
  const auto given = cli("train --example mlp --steps 1 --micro-batches 2 --run-dir " + (dir_ / "m").string());
  ASSERT_EQ(given.status, 0) << given.output;
  const auto g = last_line_json(given.output);
  EXPECT_EQ(g["micro_batches"], 2);
  const std::string line = g["split"].get<std::string>();
  EXPECT_EQ(line.rfind("split ", 0), 0u) << line;
  EXPECT_NE(line.find("by measured layer costs"), std::string::npos) << line;
  EXPECT_NE(line.find(", 2 micro-batches of 32: "), std::string::npos) << line;
  EXPECT_NE(line.find("(micro-batches as given)"), std::string::npos) << line;
}

TEST_F(TrainSplit, BalanceWithAPlanOrAWrongSumIsAClearError) {
  const auto plan = dir_ / "plan.json";
  fs::create_directories(dir_);
  std::ofstream(plan) << R"({"example":"mlp","stages":2,"replicas":1,"micro_batches":4,"schedule":"1f1b","balance":[16,16]})"
                      << "\n";
  const auto both = cli("train --plan " + plan.string() + " --balance 10,22 --steps 1 --run-dir " + (dir_ / "a").string());
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.output.find("--balance and --plan both give the split"), std::string::npos) << both.output;
  const auto wrong = cli("train --example mlp --balance 10,10 --steps 1 --run-dir " + (dir_ / "b").string(), 60);
  EXPECT_NE(wrong.status, 0);
  EXPECT_NE(wrong.output.find("--balance 10,10 sums to 20 layers; example mlp has 32"), std::string::npos) << wrong.output;
}

}  // namespace
}  // namespace pipetrain::apps::train_split_test
