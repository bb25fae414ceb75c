// `pipetrain train` end to end through the real binary: a short run of each example checks the
// summary JSON (last line) and the run directory; bad arguments give a one-line error.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>

#include "pipetrain/runtime/autocast.h"
#include "support/tfevents_reader.h"

namespace pipetrain::apps {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Run {
  int status = -1;
  std::string output;
};

// stdout and stderr of the CLI, with a hard time limit so a hang fails instead of blocking CI.
// `env` ("VAR=value ...") is added to the CLI's environment.
Run cli(const std::string& args, int seconds = 150, const std::string& env = "") {
  const std::string command = (env.empty() ? "" : "env " + env + " ") + "timeout -s KILL " + std::to_string(seconds) +
                              " " + PIPETRAIN_CLI_PATH + " " + args + " 2>&1";
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
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return json::parse(last);
}

class TrainCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipetrain-train-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void expect_run_files() {
    for (const char* f : {"metrics.jsonl", "loss.svg", "timeline.svg", "trace.json", "summary.json",
                          "checkpoint/manifest.json"}) {
      EXPECT_TRUE(fs::exists(dir_ / f)) << f;
    }
    std::ifstream trace(dir_ / "trace.json");
    EXPECT_TRUE(json::parse(trace).contains("traceEvents"));
  }
  fs::path dir_;
};

// The step losses of a run directory's metrics.jsonl, in order.
std::vector<double> step_losses(const fs::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<double> losses;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// One TensorBoard scalar: the event's step and value.
struct Scalar {
  int64_t step;
  float value;
};

// The scalars tagged `tag` in every event file under `dir` (files in name order, which is
// creation order within a second), checksums checked by the reader.
std::vector<Scalar> scalars(const fs::path& dir, const std::string& tag) {
  std::vector<Scalar> out;
  for (const auto& file : pipetrain::testing::find_tfevents(dir)) {
    const auto events = pipetrain::testing::read_tfevents(file);
    EXPECT_FALSE(events.empty()) << file;
    if (!events.empty()) {
      EXPECT_EQ(events[0].file_version, "brain.Event:2") << file;
    }
    for (const auto& e : events) {
      for (const auto& [t, v] : e.scalars) {
        if (t == tag) out.push_back({e.step, v});
      }
    }
  }
  return out;
}

// train_loss as TensorBoard got it: DeepSpeed's step (samples so far) and the metrics' losses.
void expect_train_losses(const fs::path& tb_dir, const std::vector<double>& losses, int64_t batch) {
  const auto got = scalars(tb_dir, "Train/Samples/train_loss");
  ASSERT_EQ(got.size(), losses.size()) << tb_dir;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step, static_cast<int64_t>(i + 1) * batch) << i;
    EXPECT_FLOAT_EQ(got[i].value, static_cast<float>(losses[i])) << i;
  }
}

TEST_F(TrainCommand, MlpShortRunWritesSummaryAndRunDirectory) {
  const auto r = cli("train --example mlp --steps 3 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["example"], "mlp");
  EXPECT_EQ(s["stages"], 2);
  EXPECT_EQ(s["steps"], 3);
  EXPECT_TRUE(std::isfinite(s["final_loss"].get<double>()));
  EXPECT_GT(s["samples_per_s"].get<double>(), 0);
  EXPECT_GE(s["bubble_measured"].get<double>(), 0);
  EXPECT_GT(s["bubble_simulated"].get<double>(), 0);
  EXPECT_EQ(s["ranks"].size(), 2u);
  // No GPU here: pipeline.device "auto" is the CPU, which has no allocator statistics.
  EXPECT_EQ(s["device"], torch::cuda::is_available() ? "cuda:0" : "cpu");
  for (const auto& rank : s["ranks"]) {
    EXPECT_GT(rank["peak_memory_mb"].get<double>(), 0);
    EXPECT_EQ(rank["peak_device_memory_mb"].is_null(), !torch::cuda::is_available());
  }
  expect_run_files();
  std::ifstream metrics(dir_ / "metrics.jsonl");
  int lines = 0;
  std::string line;
  while (std::getline(metrics, line)) lines += json::parse(line).contains("loss");
  EXPECT_EQ(lines, 3);
  // TensorBoard events go to the run directory by default.
  EXPECT_EQ(s["tensorboard"], (dir_ / "tensorboard").string());
  const int64_t batch = s["micro_batches"].get<int64_t>() * s["micro_batch_size"].get<int64_t>();
  expect_train_losses(dir_ / "tensorboard", step_losses(dir_), batch);

  // Resume under another layout (4 stages) for two more steps.
  const auto again = cli("train --example mlp --steps 5 --stages 4 --resume --run-dir " + dir_.string());
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("resumed from"), std::string::npos);
  const auto s2 = last_line_json(again.output);
  EXPECT_EQ(s2["first_step"], 3);
  EXPECT_EQ(s2["stages"], 4);
  // The resumed run adds its own event file, continuing DeepSpeed's sample count.
  EXPECT_EQ(pipetrain::testing::find_tfevents(dir_ / "tensorboard").size(), 2u);
  expect_train_losses(dir_ / "tensorboard", step_losses(dir_), batch);
}

TEST_F(TrainCommand, KilledRankRestartsTheGroupWhichResumesAsIfNothingHappened) {
  const fs::path straight = dir_ / "straight", killed = dir_ / "killed";
  const std::string common = "train --example mlp --steps 6 --checkpoint-every 2 --run-dir ";
  const auto a = cli(common + straight.string());
  ASSERT_EQ(a.status, 0) << a.output;
  // Rank 1 kills itself (SIGKILL) before step 3 of the first attempt; the checkpoint of step 2
  // is the latest.
  const auto b = cli(common + killed.string() + " --max-restarts 1", 150, "PIPETRAIN_FAULT_KILL_STEP=1:3");
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("rank 1 killed by signal 9"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("restarting all processes (1 of 1)"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("resumed from"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("at step 2 (restart 1)"), std::string::npos) << b.output;
  const auto want = step_losses(straight), got = step_losses(killed);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(got, want) << "same layout, optimizer state restored: bit-identical losses";
  EXPECT_EQ(last_line_json(b.output)["final_loss"], last_line_json(a.output)["final_loss"]);

  // Without restarts the failure is the command's: non-zero, naming the rank.
  const auto c = cli(common + (dir_ / "fails").string(), 150, "PIPETRAIN_FAULT_KILL_STEP=0:1");
  EXPECT_NE(c.status, 0);
  EXPECT_NE(c.output.find("rank 0 killed by signal 9"), std::string::npos) << c.output;
}

TEST_F(TrainCommand, KillDuringACheckpointKeepsThePreviousOneAndTheRunResumes) {
  const fs::path straight = dir_ / "straight";
  const std::string common = "train --example mlp --steps 6 --checkpoint-every 2 --max-restarts 1 --run-dir ";
  const auto a = cli(common + straight.string());
  ASSERT_EQ(a.status, 0) << a.output;
  const auto want = step_losses(straight);
  // Rank 0 dies in its second save (step 4) at each phase; up to "swap" the restart finds the
  // checkpoint of step 2 (in checkpoint/, or checkpoint.old/ when the crash came mid-swap),
  // from "renamed" on the new one of step 4 (checkpoint.old/ still beside it), and the losses
  // come out the same.
  const std::pair<const char*, int> phases[] = {
      {"files", 2}, {"manifest", 2}, {"swap", 2}, {"renamed", 4}, {"synced", 4}};
  for (const auto& [phase, resumed_at] : phases) {
    SCOPED_TRACE(phase);
    const fs::path run = dir_ / phase;
    const auto b = cli(common + run.string(), 150, std::string("PIPETRAIN_FAULT_KILL_CHECKPOINT=0:") + phase + ":2");
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("rank 0 killed by signal 9"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("at step " + std::to_string(resumed_at) + " (restart 1)"), std::string::npos) << b.output;
    EXPECT_EQ(step_losses(run), want);
    EXPECT_TRUE(fs::exists(run / "checkpoint" / "manifest.json"));
    EXPECT_FALSE(fs::exists(run / "checkpoint.old"));
  }
}

TEST_F(TrainCommand, CnnShortRunReportsAccuracy) {
  const auto r = cli("train --steps 4 --eval-samples 500 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["example"], "cnn");
  EXPECT_EQ(s["metric"], "accuracy");
  const double acc = s["accuracy"].get<double>();
  EXPECT_GT(acc, 0.15) << "4 steps already beat chance (10%)";
  EXPECT_LE(acc, 1.0);
  expect_run_files();
}

// Three processes over Gloo: the stem's skip goes from stage 0 straight to stage 2, the block
// skips cross one boundary each; the pipelined losses equal the one-process reference's.
TEST_F(TrainCommand, ResnetSkipsAcrossThreeProcessesMatchTheReference) {
  // The reference's micro-batches (batch norm sees each), not the count the default would choose.
  const auto r = cli("train --example resnet --stages 3 --steps 3 --micro-batches 4 --eval-samples 200 --run-dir " +
                     dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["example"], "resnet");
  const auto ref = cli("reference --example resnet --steps 3 --eval-samples 200");
  ASSERT_EQ(ref.status, 0) << ref.output;
  const double expected = last_line_json(ref.output)["final_loss"].get<double>();
  EXPECT_NEAR(s["final_loss"].get<double>(), expected, 1e-4 * std::abs(expected) + 1e-5) << r.output;
}

TEST_F(TrainCommand, GptShortRunPrintsASample) {
  const auto r = cli("train --example gpt --steps 3 --eval-samples 64 --sample-length 40 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["example"], "gpt");
  EXPECT_TRUE(s.contains("sample"));
  EXPECT_EQ(s["sample"].get<std::string>().size() > 0, true);
  EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>())) << s.dump();
  expect_run_files();
}

// Two replicas share the example's step (DeepSpeed's train_batch_size stays), so ZeRO-1 over 2
// stages x 2 replicas trains the model the one-process reference trains, each rank keeping about
// half its stage's optimizer state; the resume continues from the sharded checkpoint.
TEST_F(TrainCommand, GptZero1OnTwoReplicasMatchesTheReferenceWithHalfTheOptimizerState) {
  const auto r = cli("train --example gpt --stages 2 --replicas 2 --zero-stage 1 --steps 3 --micro-batches 2 "
                     "--eval-samples 64 --sample-length 0 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["zero_stage"], 1);
  EXPECT_EQ(s["replicas"], 2);
  EXPECT_EQ(s["micro_batches"], 2);
  const auto ref = cli("reference --example gpt --steps 3 --eval-samples 64 --sample-length 0");
  ASSERT_EQ(ref.status, 0) << ref.output;
  const double expected = last_line_json(ref.output)["final_loss"].get<double>();
  EXPECT_NEAR(s["final_loss"].get<double>(), expected, 1e-4 * std::abs(expected)) << r.output;
  for (const auto& rank : s["ranks"]) {
    const double mine = rank["optimizer_state_mb"].get<double>();
    const double whole = rank["optimizer_state_mb_without_zero"].get<double>();
    EXPECT_GT(mine, 0.3 * whole) << rank.dump();
    EXPECT_LT(mine, 0.7 * whole) << rank.dump();
  }
  EXPECT_TRUE(fs::exists(dir_ / "checkpoint/layer_00002-optim-1.pt"));
  const auto resumed = cli("train --example gpt --stages 2 --steps 4 --resume --eval-samples 64 --sample-length 0 "
                           "--run-dir " + dir_.string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(last_line_json(resumed.output)["first_step"], 3);
}

// Megatron-style tensor parallelism in the gpt example: 2 stages x 2 tensor-parallel ranks train
// the reference's model; the checkpoint holds full tensors, so a resume on 1 tensor-parallel
// rank continues, and a rank of a tensor-parallel group that dies is named by the others.
TEST_F(TrainCommand, GptOnTwoTensorParallelRanksMatchesTheReference) {
  const auto r = cli("train --example gpt --stages 2 --tensor-parallel 2 --steps 3 --eval-samples 64 "
                     "--sample-length 20 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["tensor_parallel"], 2);
  EXPECT_EQ(s["ranks"].size(), 4u);
  EXPECT_FALSE(s["sample"].get<std::string>().empty());  // generated in one process from the checkpoint
  const auto ref = cli("reference --example gpt --steps 3 --eval-samples 64 --sample-length 0");
  ASSERT_EQ(ref.status, 0) << ref.output;
  const auto expected = last_line_json(ref.output);
  EXPECT_NEAR(s["final_loss"].get<double>(), expected["final_loss"].get<double>(),
              1e-4 * expected["final_loss"].get<double>())
      << r.output;
  EXPECT_NEAR(s["val_loss"].get<double>(), expected["val_loss"].get<double>(), 1e-4 * expected["val_loss"].get<double>());
  const auto resumed = cli("train --example gpt --stages 2 --steps 4 --resume --eval-samples 64 --sample-length 0 "
                           "--run-dir " + dir_.string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(last_line_json(resumed.output)["first_step"], 3);

  const auto killed = cli("train --example gpt --stages 1 --tensor-parallel 2 --steps 3 --eval-samples 64 "
                          "--sample-length 0 --run-dir " + (dir_ / "killed").string(),
                          120, "PIPETRAIN_FAULT_KILL_STEP=1:1");
  EXPECT_NE(killed.status, 0) << killed.output;
  EXPECT_NE(killed.output.find("rank 1"), std::string::npos) << killed.output;
}

// GPT-2's dropout under tensor parallelism: --dropout reaches the model (the run leaves the
// dropout-free reference, and stays near it), and examples without dropout refuse it.
TEST_F(TrainCommand, GptTrainsWithDropoutOnTwoTensorParallelRanks) {
  const auto r = cli("train --example gpt --stages 1 --tensor-parallel 2 --steps 3 --dropout 0.1 --eval-samples 64 "
                     "--sample-length 0 --run-dir " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const double loss = last_line_json(r.output)["final_loss"].get<double>();
  const auto ref = cli("reference --example gpt --steps 3 --eval-samples 64 --sample-length 0");
  ASSERT_EQ(ref.status, 0) << ref.output;
  const double plain = last_line_json(ref.output)["final_loss"].get<double>();
  EXPECT_GT(std::abs(loss - plain), 1e-4 * plain) << r.output;
  EXPECT_LT(std::abs(loss - plain), 0.02 * plain) << r.output;
  const auto cnn = cli("train --example cnn --dropout 0.1 --steps 1 --run-dir " + (dir_ / "cnn").string());
  EXPECT_NE(cnn.status, 0);
  EXPECT_NE(cnn.output.find("example 'cnn' has no dropout setting"), std::string::npos) << cnn.output;
}

// A DeepSpeed user's config (bf16, ZeRO stage 0, "auto", an ignored DeepSpeed key) is accepted,
// its one warning is printed once, and the TensorBoard events go where its "tensorboard" says,
// with DeepSpeed's names and steps.
TEST_F(TrainCommand, DeepSpeedConfigWithTensorBoardWritesEventsThere) {
  fs::create_directories(dir_);
  const fs::path tb = dir_ / "tb-out", run = dir_ / "run", config = dir_ / "ds_config.json";
  std::ofstream(config) << R"({
    "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 1.0, "prescale_gradients": false,
    "steps_per_print": 10, "wall_clock_breakdown": false,
    "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 16},
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 0, "reduce_bucket_size": "auto"},
    "tensorboard": {"enabled": true, "output_path": ")" + tb.string() + R"(", "job_name": "mlp_job"},
    "wandb": {"enabled": false, "project": "pipetrain"}})";
  const auto r = cli("train --example mlp --steps 3 --config " + config.string() + " --run-dir " + run.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["tensorboard"], (tb / "mlp_job").string());
  const std::string warning = "DeepSpeed keys that pipetrain does not implement are ignored: \"prescale_gradients\"";
  const auto first = r.output.find(warning);
  EXPECT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warning, first + 1), std::string::npos) << "logged more than once:\n" << r.output;

  const auto files = pipetrain::testing::find_tfevents(tb);
  ASSERT_EQ(files.size(), 1u) << r.output;
  EXPECT_EQ(files[0].parent_path(), tb / "mlp_job");
  EXPECT_FALSE(fs::exists(run / "tensorboard"));  // moved, not copied
  const auto losses = step_losses(run);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_DOUBLE_EQ(losses.back(), s["final_loss"].get<double>());
  const int64_t batch = s["micro_batches"].get<int64_t>() * s["micro_batch_size"].get<int64_t>();
  expect_train_losses(tb, losses, batch);
  for (const char* tag : {"Train/Samples/lr", "Train/Samples/loss_scale", "Train/Samples/samples_per_sec"}) {
    const auto values = scalars(tb, tag);
    ASSERT_EQ(values.size(), 3u) << tag;
    for (const auto& v : values) EXPECT_GT(v.value, 0.0f) << tag;
  }
  EXPECT_EQ(scalars(tb, "Train/Samples/loss_scale")[0].value, 1.0f);  // not fp16
  const auto eval = scalars(tb, "Eval/Samples/eval_loss");
  ASSERT_EQ(eval.size(), 1u);
  EXPECT_EQ(eval[0].step, 3 * batch);
  EXPECT_FLOAT_EQ(eval[0].value, static_cast<float>(s["eval_loss"].get<double>()));
}

// A DeepSpeed config's batch sizes shape the example's data: the engine gets the micro-batches
// the config asks for. Given on the command line too, they are one clear error.
TEST_F(TrainCommand, DeepSpeedConfigBatchSizesShapeTheData) {
  fs::create_directories(dir_);
  const fs::path config = dir_ / "ds_config.json";
  std::ofstream(config) << R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 8,
                               "gradient_accumulation_steps": 6})";
  const auto r = cli("train --example mlp --steps 2 --config " + config.string() + " --run-dir " + (dir_ / "run").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto s = last_line_json(r.output);
  EXPECT_EQ(s["micro_batches"], 6);
  EXPECT_EQ(s["micro_batch_size"], 8);
  const auto both = cli("train --example mlp --steps 2 --micro-batches 4 --config " + config.string() +
                            " --run-dir " + (dir_ / "run2").string(),
                        60);
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.output.find("sets 6 micro-batches of 8 rows, the command line 4 of"), std::string::npos)
      << both.output;
}

// fp16 end to end: the loss scale the scaler keeps reaches TensorBoard as DeepSpeed logs it
// (2^initial_scale_power, doubled after each loss_scale_window clean steps).
TEST_F(TrainCommand, Fp16LogsTheScalersLossScale) {
  if (!runtime::low_precision_supported(torch::kCPU, torch::kHalf)) {
    GTEST_SKIP() << "this LibTorch has no float16 on the CPU (fp16 runs in the LibTorch 2.x suite)";
  }
  fs::create_directories(dir_);
  const fs::path run = dir_ / "run", config = dir_ / "ds_config.json";
  std::ofstream(config) << R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8,
                                        "loss_scale_window": 2, "hysteresis": 2}})";
  const auto r = cli("train --example mlp --steps 3 --config " + config.string() + " --run-dir " + run.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(last_line_json(r.output)["precision"], "fp16");
  const auto scales = scalars(run / "tensorboard", "Train/Samples/loss_scale");
  ASSERT_EQ(scales.size(), 3u);
  EXPECT_EQ(scales[0].value, 256.0f);
  EXPECT_EQ(scales[1].value, 512.0f) << "two clean steps double the scale";
  EXPECT_EQ(scales[2].value, 512.0f);
}

TEST_F(TrainCommand, BadArgumentsGiveOneLineAndUsage) {
  for (const char* args : {"train --stages 0", "train --example nope", "train --schedule sideways",
                           "train --steps 3 --epochs 1"}) {
    SCOPED_TRACE(args);
    const auto r = cli(args, 30);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.output.find("train"), std::string::npos) << r.output;
  }
  const auto r = cli("train --resume --run-dir " + (dir_ / "none").string(), 30);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("no checkpoint"), std::string::npos) << r.output;
  // A numeric bound names itself and the value (CLI11's own said "not in range 0.000000 to
  // 1797693134862315708...").
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"train --steps -3", "--steps: must be > 0, got -3"},
           {"train --checkpoint-every -1", "--checkpoint-every: must be >= 0, got -1"},
           {"launch -n abc -- true", "--nproc: must be a number > 0, got 'abc'"}}) {
    SCOPED_TRACE(args);
    const auto bad = cli(args, 30);
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.output.find(expect), std::string::npos) << bad.output;
    EXPECT_EQ(bad.output.find("179769"), std::string::npos) << bad.output;
  }
}

// An impossible layout is one line naming the numbers and the fix, before any process starts
// (no run directory made or announced); it used to fork a worker per stage first.
TEST_F(TrainCommand, ImpossibleLayoutsFailBeforeAnyProcessStarts) {
  const auto run_dir = dir_ / "never";
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : {Case{"--stages 1000", "--stages 1000 is more than the example's"},
                        Case{"--stages 2 --replicas 20000", "40000 processes on"}}) {
    SCOPED_TRACE(c.args);
    const auto r = cli("train --example mlp --steps 2 --run-dir " + run_dir.string() + " " + c.args, 30);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("run directory:"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(run_dir)) << "the run directory was made before the layout was checked";
  }
  const auto r = cli("launch -n 100000 -- true", 30);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("100000 processes on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--oversubscribe"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace pipetrain::apps
