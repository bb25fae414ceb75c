// `pipetrain reference`: argument errors, and short runs ending in a JSON summary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli_runner.h"

namespace pipetrain::apps {
namespace {

using testing::CliRun;
using testing::run;
using testing::last_line;

using ::testing::HasSubstr;

TEST(ReferenceCommand, BadArgumentsGiveOneLineAndTheUsage) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases{
      {{"--example", "vgg"}, "--example expects one of cnn, gpt, mlp, resnet, got 'vgg'"},
      {{"--example", "mlp", "--steps", "0"}, "--steps expects an integer >= 1, got '0'"},
      {{"--example", "mlp", "--steps", "two"}, "--steps expects an integer >= 1, got 'two'"},
      {{"--example", "mlp", "--steps", "2", "--epochs", "1"},
       "--steps and --epochs are alternatives"},
      {{"--example", "mlp", "--epochs", "1"}, "--epochs: the mlp example's data has no epochs"},
      {{"--example", "mlp", "--lr", "-1"}, "--lr expects a number > 0, got '-1'"},
      {{"--example", "mlp", "--bogus"}, "unknown argument '--bogus'"},
      {{"--example", "mlp", "--config", "/nonexistent.json"},
       "cannot read config file /nonexistent.json"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"reference"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(std::string("pipetrain reference: error: ") + c.message));
    EXPECT_THAT(r.err, HasSubstr("usage: pipetrain reference"));
  }
}

TEST(ReferenceCommand, HelpListsTheOptions) {
  const CliRun r = run({"reference", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--example"));
  EXPECT_THAT(r.out, HasSubstr("--micro-batches"));
  EXPECT_THAT(r.out, HasSubstr("pipetrain reference --example gpt"));
}

TEST(ReferenceCommand, MlpRunEndsWithAJsonSummary) {
  const CliRun r = run({"reference", "--example", "mlp", "--steps", "2", "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step     1/2  loss 0.9957"));
  const auto summary = nlohmann::json::parse(last_line(r.out));
  EXPECT_EQ(summary["example"], "mlp");
  EXPECT_EQ(summary["steps"], 2);
  EXPECT_EQ(summary["samples"], 512);
  EXPECT_EQ(summary["metric"], "loss");
  EXPECT_NEAR(summary["loss"].get<double>(), 0.99567, 1e-4);
}

TEST(ReferenceCommand, GptRunPrintsASample) {
  const CliRun r = run({"reference", "--example", "gpt", "--steps", "2", "--micro-batch-size", "2",
                        "--micro-batches", "1", "--eval-samples", "4", "--sample-length", "20",
                        "--threads", "1"});
  if (r.code == 1 && r.err.find("fortunes") != std::string::npos) GTEST_SKIP() << r.err;
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("sample:\n"));
  const auto summary = nlohmann::json::parse(last_line(r.out));
  EXPECT_EQ(summary["metric"], "val_loss");
  EXPECT_GT(summary["val_loss"].get<double>(), 0);
}

}  // namespace
}  // namespace pipetrain::apps
