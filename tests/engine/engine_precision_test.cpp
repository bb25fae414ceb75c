// Mixed precision in the engine against the oracle run in the same precision in one process:
// bf16 (and fp16 where this LibTorch computes it on the CPU) with float32 master weights,
// activations crossing stages in the low precision, fp16 loss scaling that skips an overflowed
// step on every rank, and checkpoints that resume with the scaler.
#include <gtest/gtest.h>

#include <atomic>
#include <ATen/autocast_mode.h>

#include <mutex>

#include "engine/checkpoint_support.h"
#include "engine/engine_models.h"
#include "engine/engine_oracle.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/runtime/autocast.h"
#include "pipetrain/runtime/small_gemm_bf16.h"

namespace pipetrain::testing {
namespace {

// Identity that records the dtype it was given (the first layer of stage 1 sees what crossed).
std::atomic<int> seen_dtype{-1};
struct DtypeProbeImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) {
    seen_dtype = static_cast<int>(x.scalar_type());
    return x;
  }
};
TORCH_MODULE(DtypeProbe);

// Identity whose backward multiplies the gradient by inf on one micro-batch of one step: an
// overflow that only the stage holding it sees. Counts its training forwards to know the step.
struct OverflowAtImpl : torch::nn::Module {
  OverflowAtImpl(int64_t micro_batches, int64_t step) : m(micro_batches), at_step(step) {}
  torch::Tensor forward(const torch::Tensor& x) {
    if (!is_training() || !torch::GradMode::is_enabled()) return x;
    const int64_t call = calls++;
    if (call != at_step * m) return x;
    auto y = x.clone();
    if (y.requires_grad()) y.register_hook([](torch::Tensor g) { return g * INFINITY; });
    return y;
  }
  int64_t m, at_step, calls = 0;
};
TORCH_MODULE(OverflowAt);

// 0 Linear(6,16) 1 ReLU 2 Linear 3 ReLU | 4 probe (or overflow) 5 Linear 6 Tanh 7 Linear(16,3):
// uniform over 2 stages puts layer 4 first on stage 1.
PipelineModule probed_mlp(int64_t overflow_step = -1, int64_t micro_batches = 4) {
  PipelineModule m;
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 6, 16));
  m.layers.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 16, 16));
  m.layers.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  if (overflow_step >= 0) {
    m.layers.push_back(LayerSpec::make("Overflow", "Overflow", [=] {
      return torch::nn::AnyModule(OverflowAt(micro_batches, overflow_step));
    }));
  } else {
    m.layers.push_back(LayerSpec::of<DtypeProbe>("Probe"));
  }
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 16, 16));
  m.layers.push_back(LayerSpec::of<torch::nn::Tanh>("Tanh"));
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 16, 3));
  m.loss = mse;
  return m;
}

bool fp16_on_cpu() { return runtime::low_precision_supported(torch::kCPU, torch::kHalf); }

struct PrecisionCase {
  std::string name;
  std::string precision;
  std::string schedule;
  int stages, chunks, checkpoint_interval, replicas;
  bool deferred_linear = false;
};
void PrintTo(const PrecisionCase& c, std::ostream* out) { *out << c.name; }

class EnginePrecision : public ::testing::TestWithParam<PrecisionCase> {};

// Without the fused Linear path both runs compute each micro-batch with the same low-precision
// ops on the same values and accumulate float32 gradients in the same order, so they agree to
// float32 summation order (replicas average in another order): the oracle's default tolerance.
// The fused path computes a group's weight gradient as one bf16 product over all its rows (one
// rounding of the sum, 2^-9 relative, where autocast rounds each micro-batch's product): after
// 3 steps at lr 0.05 parameters move apart by about 3 x 0.05 x 2^-9 x |dW|, so rtol 1e-3 and
// atol 1e-4 for those cases.
// On the native bf16 kernels (AVX512_BF16) the fused path also computes y and dx itself: each
// output is rounded once after a float32 bias where autocast's product adds a bf16 bias, so
// activations differ from the reference by up to a bf16 unit (2^-8) in places, and parameters
// by about 3 x 0.05 x 2^-8 x |dW| (3e-4 measured): rtol 2e-3 and atol 5e-4. Against the same
// kernels in one stage the pipeline must agree to float32 summation order.
TEST_P(EnginePrecision, PipelineEqualsOneProcessInTheSamePrecision) {
  const auto& p = GetParam();
  if (p.precision == "fp16" && !fp16_on_cpu()) GTEST_SKIP() << "this LibTorch has no float16 on the CPU";
  OracleCase c;
  c.module = [] { return probed_mlp(); };
  c.config = oracle_config(4, p.schedule);
  c.config.set_precision(p.precision);
  c.config.pipeline.chunks = p.chunks;
  c.config.pipeline.activation_checkpoint_interval = p.checkpoint_interval;
  c.config.pipeline.deferred_linear = p.deferred_linear;
  c.stages = p.stages;
  c.replicas = p.replicas;
  c.data = [](int64_t s, int r, int m) { return mlp_batch(s, r, m, 4, 6, 3); };
  OracleRun pipelined;
  if (p.deferred_linear && p.precision == "bf16" && runtime::native_bf16_available()) {
    expect_same_training(c, 2e-3, 5e-4, &pipelined);
    // The same kernels in one stage: the pipeline changes nothing but the order of float32 sums.
    OracleCase one_stage = c;
    one_stage.stages = 1;
    const auto single = pipeline_run(one_stage);
    ASSERT_EQ(single.losses.size(), pipelined.losses.size());
    for (size_t s = 0; s < single.losses.size(); ++s) {
      EXPECT_NEAR(pipelined.losses[s], single.losses[s], 1e-5 * std::abs(single.losses[s])) << "step " << s;
    }
    for (const auto& [name, t] : pipelined.params) {
      EXPECT_TRUE(torch::allclose(t, single.params.at(name), 1e-5, 1e-6))
          << name << ": max difference " << (t - single.params.at(name)).abs().max().item<double>();
    }
  } else if (p.deferred_linear) {
    expect_same_training(c, 1e-3, 1e-4, &pipelined);
  } else {
    expect_same_training(c, 1e-4, 1e-6, &pipelined);
  }
  for (const auto& [name, t] : pipelined.params) EXPECT_EQ(t.scalar_type(), torch::kFloat) << name << ": master weights";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, EnginePrecision,
    ::testing::Values(PrecisionCase{"bf16_1f1b_P2", "bf16", "1f1b", 2, 1, 0, 1},
                      PrecisionCase{"bf16_one_stage_checkpoint1", "bf16", "1f1b", 1, 1, 1, 1},
                      PrecisionCase{"bf16_1f1b_P4_checkpoint1", "bf16", "1f1b", 4, 1, 1, 1},
                      PrecisionCase{"bf16_interleaved_P2_V2", "bf16", "interleaved", 2, 2, 0, 1},
                      PrecisionCase{"bf16_zb_h1_P2", "bf16", "zb-h1", 2, 1, 0, 1},
                      PrecisionCase{"bf16_1f1b_P2_D2", "bf16", "1f1b", 2, 1, 0, 2},
                      PrecisionCase{"bf16_fused_1f1b_P2", "bf16", "1f1b", 2, 1, 0, 1, true},
                      PrecisionCase{"bf16_fused_zb_h1_P3", "bf16", "zb-h1", 3, 1, 0, 1, true},
                      PrecisionCase{"bf16_fused_1f1b_P2_D2_checkpoint1", "bf16", "1f1b", 2, 1, 1, 2, true},
                      PrecisionCase{"fp16_fused_1f1b_P2", "fp16", "1f1b", 2, 1, 0, 1, true},
                      PrecisionCase{"fp16_1f1b_P2", "fp16", "1f1b", 2, 1, 0, 1},
                      PrecisionCase{"fp16_1f1b_P2_D2", "fp16", "1f1b", 2, 1, 0, 2}),
    [](const auto& info) { return info.param.name; });

TEST(EnginePrecision, Bf16DiffersFromFp32SoTheComparisonCanTell) {
  OracleCase c;
  c.module = [] { return probed_mlp(); };
  c.config = oracle_config(4, "1f1b");
  c.data = [](int64_t s, int r, int m) { return mlp_batch(s, r, m, 4, 6, 3); };
  const auto fp32 = reference_run(c);
  c.config.set_precision("bf16");
  const auto bf16 = reference_run(c);
  EXPECT_NE(fp32.losses[0], bf16.losses[0]);
  EXPECT_NEAR(fp32.losses[0], bf16.losses[0], 2e-2 * std::abs(fp32.losses[0]));
}

// One step on 2 stages: what stage 1 receives, and the bytes each rank sent.
struct StepTraffic {
  int dtype = -1;
  int64_t bytes = 0;
  c10::ScalarType compute = torch::kFloat;
};
StepTraffic one_step(const std::string& precision) {
  auto config = ckpt_config(2);
  config.set_precision(precision);
  StepTraffic out;
  std::mutex mutex;
  seen_dtype = -1;
  run_pipeline(2, config, [] { return probed_mlp(); }, [&](PipelineEngine& engine) {
    int i = 0;
    FunctionIterator it([&]() -> std::optional<MicroBatch> {
      if (i >= engine.micro_batches()) return std::nullopt;
      return mlp_batch(0, 0, i++, 4, 6, 3);
    });
    engine.train_batch(it);
    std::lock_guard<std::mutex> lock(mutex);
    out.bytes += engine.last_step().bytes_sent;
    out.compute = engine.compute_dtype();
    for (const auto& p : engine.parameters()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat);
      if (p.grad().defined()) {
        EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
      }
    }
  });
  out.dtype = seen_dtype;
  return out;
}

TEST(EnginePrecision, ActivationsAndGradientsCrossStagesInBf16AtHalfTheBytes) {
  const auto fp32 = one_step("fp32");
  const auto bf16 = one_step("bf16");
  EXPECT_EQ(fp32.dtype, static_cast<int>(torch::kFloat));
  EXPECT_EQ(bf16.dtype, static_cast<int>(torch::kBFloat16));
  EXPECT_EQ(bf16.compute, torch::kBFloat16);
  ASSERT_GT(fp32.bytes, 0);
  EXPECT_EQ(bf16.bytes * 2, fp32.bytes);
}

// A refused dtype must leave the thread's autocast as it was: a leaked nesting level kept the
// cache of cast weights alive across optimizer steps (every later bf16 run used stale weights).
TEST(EnginePrecision, ProbingARefusedDtypeLeavesAutocastAsItWas) {
  const auto before = runtime::AutocastState::current();
  (void)runtime::low_precision_supported(torch::kCPU, torch::kHalf);
  const auto after = runtime::AutocastState::current();
  EXPECT_EQ(after.cpu_enabled, before.cpu_enabled);
  EXPECT_EQ(after.cpu_dtype, before.cpu_dtype);
  EXPECT_EQ(at::autocast::increment_nesting(), 1) << "no nesting level left behind";
  at::autocast::decrement_nesting();
}

TEST(EnginePrecision, Fp16OnACpuWithoutItIsAConfigErrorNamingTheFix) {
  if (fp16_on_cpu()) GTEST_SKIP() << "this LibTorch computes float16 on the CPU";
  auto config = ckpt_config(1);
  config.set_precision("fp16");
  auto hub = comm::InProcessHub::create(1);
  try {
    PipelineEngine engine(probed_mlp(), config, hub->endpoint(0));
    FAIL() << "fp16 on this CPU must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use bf16"), std::string::npos) << e.what();
  }
}

// An overflow on stage 1 alone, at step 1 (0-based) of 3: both ranks skip that step and halve
// the scale (hysteresis 1), and the run still equals the one-process run with the same overflow.
TEST(EnginePrecision, Fp16OverflowOnOneStageSkipsTheStepOnEveryRank) {
  if (!fp16_on_cpu()) GTEST_SKIP() << "this LibTorch has no float16 on the CPU";
  auto config = ckpt_config(2);
  config.set_precision("fp16");
  config.fp16.hysteresis = 1;
  config.fp16.initial_scale_power = 8;
  std::mutex mutex;
  std::vector<std::vector<bool>> skipped(2);
  std::vector<std::vector<double>> scales(2);
  run_pipeline(2, config, [] { return probed_mlp(1, 4); }, [&](PipelineEngine& engine) {
    for (int64_t s = 0; s < 3; ++s) {
      int i = 0;
      FunctionIterator it([&]() -> std::optional<MicroBatch> {
        if (i >= engine.micro_batches()) return std::nullopt;
        return mlp_batch(s, 0, i++, 4, 6, 3);
      });
      engine.train_batch(it);
      std::lock_guard<std::mutex> lock(mutex);
      skipped[static_cast<size_t>(engine.stage())].push_back(engine.last_step().skipped);
      scales[static_cast<size_t>(engine.stage())].push_back(engine.loss_scale());
    }
  });
  for (int st = 0; st < 2; ++st) {
    EXPECT_EQ(skipped[static_cast<size_t>(st)], (std::vector<bool>{false, true, false})) << "stage " << st;
    EXPECT_EQ(scales[static_cast<size_t>(st)], (std::vector<double>{256, 128, 128})) << "stage " << st;
  }
  OracleCase c;
  c.module = [] { return probed_mlp(1, 4); };
  c.config = config;
  c.config.train_batch_size = 0;
  c.data = [](int64_t s, int r, int m) { return mlp_batch(s, r, m, 4, 6, 3); };
  // The fused path's tolerance (PipelineEqualsOneProcessInTheSamePrecision): a group's weight
  // gradient is one fp16 product where the reference rounds each micro-batch's. The parameters
  // stay within 1e-4, the whole model's gradient norm moved 1.2e-4 (LibTorch 2.6).
  expect_same_training(c, 1e-3, 1e-4);
}

// The parser refuses ZeRO-2/3; a config built in code meets the same check in the engine.
TEST(EngineConfigChecks, ZeroStage2BuiltInCodeIsRefusedByTheEngine) {
  auto config = ckpt_config(1);
  config.zero_optimization.stage = 2;
  auto hub = comm::InProcessHub::create(1);
  try {
    PipelineEngine engine(probed_mlp(), config, hub->endpoint(0));
    FAIL() << "ZeRO-2 with a pipeline must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("stage"), std::string::npos) << e.what();
  }
}

class PrecisionCheckpoint : public CheckpointDirTest {};

// A run saved mid-way resumes to the same losses as the uninterrupted one, in bf16, and in
// fp16 with the scaler's state (a scale that moved during the first half).
void expect_resume_is_exact(const std::string& precision, const std::filesystem::path& dir) {
  auto config = ckpt_config(2);
  config.set_precision(precision);
  config.fp16.loss_scale_window = 2;  // the scale grows before the checkpoint
  const auto ckpt = (dir / "ckpt").string();
  std::vector<double> straight;
  double scale_at_save = 0;
  std::mutex mutex;
  auto make = [] { return mlp(5, 12, 5, 4); };
  run_pipeline(2, config, make, [&](PipelineEngine& engine) {
    train_steps(engine, 3, 0);
    save_checkpoint(engine, ckpt);
    const double scale = engine.loss_scale();
    const auto losses = train_steps(engine, 3, 3);
    std::lock_guard<std::mutex> lock(mutex);
    straight = losses;
    scale_at_save = scale;
  });
  run_pipeline(2, config, make, [&](PipelineEngine& engine) {
    EXPECT_EQ(load_checkpoint(engine, ckpt), 3);
    EXPECT_EQ(engine.loss_scale(), scale_at_save);
    EXPECT_EQ(train_steps(engine, 3, 3), straight);
  });
  if (precision == "fp16") {
    EXPECT_EQ(scale_at_save, 65536.0 * 2) << "the window of 2 grew the scale once";
  }
}

TEST_F(PrecisionCheckpoint, Bf16ResumesExactly) { expect_resume_is_exact("bf16", dir_); }

TEST_F(PrecisionCheckpoint, Fp16ResumesWithTheScaler) {
  if (!fp16_on_cpu()) GTEST_SKIP() << "this LibTorch has no float16 on the CPU";
  expect_resume_is_exact("fp16", dir_);
}

}  // namespace
}  // namespace pipetrain::testing
