// Real DeepSpeed configs parse: the keys pipetrain honours land in their fields, the DeepSpeed
// keys it does not implement come back as one warning, "auto" means the default, ZeRO stages
// beyond 0 and unknown keys are errors that say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pipetrain/engine/config.h"
#include "pipetrain/error.h"

namespace pipetrain {
namespace {

EngineConfig parse(const std::string& text) {
  return EngineConfig::from_json_text(text, "ds_config.json", ConfigWarnings::Collect);
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The one warning listing the ignored DeepSpeed keys ("" when there is none).
std::string ignored_warning(const EngineConfig& c) {
  for (const auto& w : c.warnings) {
    if (contains(w, "DeepSpeed keys that pipetrain does not implement are ignored")) return w;
  }
  return "";
}

void expect_ignored_exactly(const EngineConfig& c, const std::vector<std::string>& keys) {
  const auto w = ignored_warning(c);
  if (keys.empty()) {
    EXPECT_EQ(w, "");
    return;
  }
  EXPECT_EQ(w.rfind("ds_config.json: ", 0), 0u) << w;
  for (const auto& k : keys) EXPECT_TRUE(contains(w, "\"" + k + "\"")) << k << " not in: " << w;
  EXPECT_EQ(static_cast<size_t>(std::count(w.begin(), w.end(), '"')), 2 * keys.size()) << w;
}

// DeepSpeedExamples' CIFAR-10 ds_config, with ZeRO at stage 0.
TEST(DeepSpeedConfig, CifarExampleWithZeroStage0AndFp16) {
  const auto c = parse(R"({
    "train_batch_size": 16,
    "steps_per_print": 2000,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}},
    "gradient_clipping": 1.0,
    "prescale_gradients": false,
    "fp16": {"enabled": true, "fp16_master_weights_and_grads": false, "loss_scale": 0, "loss_scale_window": 500,
             "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 15},
    "wall_clock_breakdown": false,
    "zero_optimization": {"stage": 0, "allgather_partitions": true, "reduce_scatter": true,
                          "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000,
                          "overlap_comm": true, "contiguous_gradients": true, "cpu_offload": false}})");
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.steps_per_print, 2000);
  EXPECT_EQ(c.optimizer.type, "AdamW");  // DeepSpeed runs it as FusedAdam(adam_w_mode=True)
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 3e-7);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.precision(), "fp16");
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.initial_scale_power, 15);
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_FALSE(c.tensorboard.enabled);
  ASSERT_EQ(c.warnings.size(), 1u);
  expect_ignored_exactly(c, {"prescale_gradients", "fp16.fp16_master_weights_and_grads",
                             "zero_optimization.allgather_partitions", "zero_optimization.reduce_scatter",
                             "zero_optimization.allgather_bucket_size", "zero_optimization.reduce_bucket_size",
                             "zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
                             "zero_optimization.cpu_offload"});
}

// Megatron-DeepSpeed's GPT pretraining ds_config (examples_deepspeed), bf16 variant.
TEST(DeepSpeedConfig, MegatronGptPretrainingBf16) {
  auto c = parse(R"({
    "train_batch_size": 256,
    "train_micro_batch_size_per_gpu": 4,
    "steps_per_print": 10,
    "zero_optimization": {"stage": 0},
    "gradient_clipping": 1.0,
    "prescale_gradients": false,
    "fp16": {"enabled": false, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
             "initial_scale_power": 11},
    "bf16": {"enabled": true},
    "wall_clock_breakdown": false})");
  EXPECT_EQ(c.precision(), "bf16");
  EXPECT_EQ(c.fp16.initial_scale_power, 11);  // read, though fp16 is off
  EXPECT_EQ(c.zero_optimization.stage, 0);
  c.resolve_batch_sizes(1);
  EXPECT_EQ(c.gradient_accumulation_steps, 64);
  ASSERT_EQ(c.warnings.size(), 1u);
  expect_ignored_exactly(c, {"prescale_gradients"});
}

// Megatron-DeepSpeed with fp16, the monitors, curriculum learning and activation checkpointing.
TEST(DeepSpeedConfig, MegatronGptFp16WithMonitorsAndCurriculum) {
  const auto c = parse(R"({
    "train_batch_size": 512, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 64,
    "steps_per_print": 100, "gradient_clipping": 1.0, "prescale_gradients": false,
    "zero_optimization": {"stage": 0},
    "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2,
             "consecutive_hysteresis": false, "min_loss_scale": 1, "initial_scale_power": 12},
    "bf16": {"enabled": false},
    "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 80,
                            "max_difficulty": 2048, "schedule_type": "fixed_linear",
                            "schedule_config": {"total_curriculum_step": 30000, "difficulty_step": 8}},
    "activation_checkpointing": {"partition_activations": false, "contiguous_memory_optimization": false},
    "flops_profiler": {"enabled": false, "profile_step": 1},
    "tensorboard": {"enabled": true, "output_path": "output/tensorboard/", "job_name": "gpt_125m"},
    "wandb": {"enabled": true, "group": "pretrain", "team": "lab", "project": "gpt"},
    "csv_monitor": {"enabled": false, "output_path": "output/csv/", "job_name": "gpt_125m"},
    "comet": {"enabled": false, "project": "gpt"},
    "wall_clock_breakdown": true})");
  EXPECT_EQ(c.gradient_accumulation_steps, 64);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.precision(), "fp16");
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "output/tensorboard/");
  EXPECT_EQ(c.tensorboard.job_name, "gpt_125m");
  ASSERT_EQ(c.warnings.size(), 2u);
  expect_ignored_exactly(c, {"prescale_gradients", "curriculum_learning", "activation_checkpointing",
                             "flops_profiler", "fp16.consecutive_hysteresis"});
  // Only the enabled monitor pipetrain cannot write is warned about.
  const auto& monitor = c.warnings[1];
  EXPECT_TRUE(contains(monitor, "\"wandb\"")) << monitor;
  EXPECT_TRUE(contains(monitor, "not supported; ignored")) << monitor;
  for (const auto& w : c.warnings) EXPECT_FALSE(contains(w, "csv_monitor") || contains(w, "comet")) << w;
}

// The HF Trainer's ds_config with "auto" for everything it fills in (ZeRO at stage 0 here).
TEST(DeepSpeedConfig, HfTrainerAutoValuesMeanTheDefaults) {
  const auto c = parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 0, "allgather_partitions": true, "allgather_bucket_size": 2e8,
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false})");
  const EngineConfig defaults;
  const OptimizerConfig optimizer;
  const SchedulerConfig scheduler;
  EXPECT_EQ(c.train_batch_size, 0);  // 0 = derived, as when absent
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 0);
  EXPECT_EQ(c.gradient_accumulation_steps, 0);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, defaults.gradient_clipping);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, optimizer.lr);
  EXPECT_EQ(c.optimizer.betas, optimizer.betas);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, optimizer.eps);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, optimizer.weight_decay);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, scheduler.warmup_max_lr);
  EXPECT_EQ(c.scheduler.warmup_num_steps, scheduler.warmup_num_steps);
  EXPECT_EQ(c.precision(), "fp32");
  // "auto" asks for nothing, so the auto buckets are not in the warning; the others are.
  expect_ignored_exactly(c, {"zero_optimization.allgather_partitions", "zero_optimization.allgather_bucket_size"});
}

TEST(DeepSpeedConfig, AutoOnlyWhereDeepSpeedAcceptsIt) {
  for (const char* text : {R"({"steps_per_print": "auto"})", R"({"seed": "auto"})",
                           R"({"fp16": {"loss_scale_window": "auto"}})",
                           R"({"optimizer": {"type": "SGD", "params": {"momentum": "auto"}}})"}) {
    const auto e = error_of(text);
    EXPECT_TRUE(contains(e, "got \"auto\"")) << text << ": " << e;
    EXPECT_TRUE(contains(e, "\"auto\" is accepted only where DeepSpeed")) << e;
  }
  // WarmupDecayLR needs the run's length, which "auto" cannot give here.
  const auto decay = error_of(R"({"scheduler": {"type": "WarmupDecayLR",
      "params": {"warmup_num_steps": 10, "total_num_steps": "auto"}}})");
  EXPECT_TRUE(contains(decay, "\"scheduler.params.total_num_steps\" is \"auto\"")) << decay;
  EXPECT_TRUE(contains(decay, "give the number of steps")) << decay;
  // DeepSpeed's pipeline block: its "stages" may be "auto" (the caller decides).
  const auto p = parse(R"({"pipeline": {"stages": "auto", "partition": "parameters", "seed_layers": false,
      "activation_checkpoint_interval": 2, "pipe_partitioned": true, "grad_partitioned": true}})");
  EXPECT_EQ(p.pipeline.stages, 0);
  EXPECT_EQ(p.pipeline.activation_checkpoint_interval, 2);
  expect_ignored_exactly(p, {"pipeline.partition", "pipeline.seed_layers", "pipeline.pipe_partitioned",
                             "pipeline.grad_partitioned"});
}

TEST(DeepSpeedConfig, ZeroStage1IsAcceptedAndStagesBeyondItAreErrorsSayingWhy) {
  const auto one = parse(R"({"zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}})");
  EXPECT_EQ(one.zero_optimization.stage, 1);
  expect_ignored_exactly(one, {"zero_optimization.reduce_bucket_size"});
  for (int stage : {2, 3}) {
    const auto e = error_of(R"({"zero_optimization": {"stage": )" + std::to_string(stage) + "}}");
    EXPECT_TRUE(contains(e, "ZeRO stage 2/3 does not combine with pipeline parallelism (as in DeepSpeed); "
                            "use stage 0 or 1"))
        << e;
  }
  EXPECT_TRUE(contains(error_of(R"({"zero_optimization": {"stage": 4}})"), "stages are 0 to 3"));
  EXPECT_TRUE(contains(error_of(R"({"zero_optimization": {"stage": -1}})"), "zero_optimization.stage"));
  // DeepSpeed's deprecated boolean form: true is stage 1.
  EXPECT_EQ(parse(R"({"zero_optimization": false})").zero_optimization.stage, 0);
  EXPECT_EQ(parse(R"({"zero_optimization": true})").zero_optimization.stage, 1);
  // The check also holds for a config built in code.
  ZeroConfig z;
  EXPECT_NO_THROW(z.check());
  z.stage = 1;
  EXPECT_NO_THROW(z.check());
  z.stage = 3;
  EXPECT_THROW(z.check(), ConfigError);
}

TEST(DeepSpeedConfig, UnknownKeysStayErrorsNamingOnlyThem) {
  const auto top = error_of(R"({"prescale_gradients": false, "amp": {"enabled": false}, "trian_batch_size": 8})");
  EXPECT_TRUE(contains(top, "unknown key \"trian_batch_size\"")) << top;
  EXPECT_FALSE(contains(top, "prescale_gradients")) << top;  // accepted, and not buried in the known list
  EXPECT_TRUE(contains(top, "train_batch_size")) << top;
  const std::vector<std::pair<std::string, std::string>> nested{
      {R"({"zero_optimization": {"stage": 0, "stgae": 1}})", "\"zero_optimization.stgae\""},
      {R"({"tensorboard": {"enabled": true, "outputpath": "x"}})", "\"tensorboard.outputpath\""},
      {R"({"fp16": {"enabled": false, "loss_scael": 0}})", "\"fp16.loss_scael\""},
      {R"({"bf16": {"enable": true}})", "\"bf16.enable\""},
      {R"({"wandb": {"enabled": false, "projcet": "x"}})", "\"wandb.projcet\""},
      {R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas2": [0.9, 0.9]}}})",
       "\"optimizer.params.betas2\""}};
  for (const auto& [text, key] : nested) {
    const auto e = error_of(text);
    EXPECT_TRUE(contains(e, "unknown key " + key)) << text << ": " << e;
  }
  EXPECT_TRUE(contains(error_of(R"({"tensorboard": {"enabled": "yes"}})"),
                       "\"tensorboard.enabled\" must be true or false"));
  EXPECT_TRUE(contains(error_of(R"({"tensorboard": {"job_name": ""}})"), "tensorboard.job_name"));
  EXPECT_TRUE(contains(error_of(R"({"tensorboard": true})"), "\"tensorboard\" must be a JSON object"));
}

TEST(DeepSpeedConfig, KnownButUnimplementedKeysInsideBlocksWarn) {
  const auto c = parse(R"({
    "optimizer": {"type": "Adam", "legacy_fusion": false,
                  "params": {"lr": 1e-4, "torch_adam": true, "adam_w_mode": true, "bias_correction": true}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_type": "log",
                                                 "last_batch_iteration": -1}},
    "fp16": {"enabled": false, "auto_cast": false},
    "bf16": {"enabled": false, "immediate_grad_update": false}})");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-4);
  expect_ignored_exactly(c, {"optimizer.legacy_fusion", "optimizer.params.torch_adam",
                             "optimizer.params.bias_correction", "scheduler.params.last_batch_iteration",
                             "fp16.auto_cast", "bf16.immediate_grad_update"});
  ASSERT_EQ(c.warnings.size(), 1u);
  // Both of DeepSpeed's warm-ups are implemented: nothing to say.
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_EQ(parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear"}}})").scheduler.warmup_type,
            "linear");
}

TEST(DeepSpeedConfig, AdamWithWeightDecayIsAdamWUnlessAdamWModeIsOff) {
  auto type_of = [](const std::string& params) {
    return parse(R"({"optimizer": {"type": "Adam", "params": )" + params + "}}").optimizer.type;
  };
  EXPECT_EQ(type_of(R"({"lr": 1e-3, "weight_decay": 0.01})"), "AdamW");  // DeepSpeed's default
  EXPECT_EQ(type_of(R"({"lr": 1e-3, "weight_decay": 0.01, "adam_w_mode": true})"), "AdamW");
  EXPECT_EQ(type_of(R"({"lr": 1e-3, "weight_decay": 0.01, "adam_w_mode": false})"), "Adam");
  EXPECT_EQ(type_of(R"({"lr": 1e-3})"), "Adam");  // no decay: the same update either way
}

TEST(DeepSpeedConfig, Bfloat16IsTheOlderNameOfBf16) {
  EXPECT_EQ(parse(R"({"bfloat16": {"enabled": true}})").precision(), "bf16");
  EXPECT_TRUE(contains(error_of(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})"), "keep one"));
  EXPECT_TRUE(contains(error_of(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"), "enable one"));
}

TEST(DeepSpeedConfig, TensorBoardDefaultsAreDeepSpeeds) {
  const auto c = parse(R"({"tensorboard": {"enabled": true}})");
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "");
  EXPECT_EQ(c.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_TRUE(c.warnings.empty());
  // Both blocks survive the document the config writes (checkpoint manifests hold it).
  auto written = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0, "overlap_comm": true},
                           "tensorboard": {"enabled": true, "output_path": "/tmp/tb", "job_name": "j"}})");
  written.resolve_batch_sizes(1);
  const auto again = parse(written.to_json_text());
  EXPECT_TRUE(again.tensorboard.enabled);
  EXPECT_EQ(again.tensorboard.output_path, "/tmp/tb");
  EXPECT_EQ(again.tensorboard.job_name, "j");
  EXPECT_TRUE(again.warnings.empty());
}

TEST(DeepSpeedConfig, WarningsAreLoggedOnceWhenAsked) {
  const std::string text = R"({"prescale_gradients": false, "memory_breakdown": false,
                               "wandb": {"enabled": true}})";
  ::testing::internal::CaptureStderr();
  const auto logged = EngineConfig::from_json_text(text, "ds_config.json");
  const auto err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(logged.warnings.size(), 2u);
  for (const auto& w : logged.warnings) {
    size_t count = 0;
    for (size_t at = err.find(w); at != std::string::npos; at = err.find(w, at + 1)) ++count;
    EXPECT_EQ(count, 1u) << w << "\nlogged:\n" << err;
  }
  EXPECT_TRUE(contains(err, "warning: ")) << err;
  ::testing::internal::CaptureStderr();
  const auto quiet = EngineConfig::from_json_text(text, "ds_config.json", ConfigWarnings::Collect);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(quiet.warnings, logged.warnings);
}

}  // namespace
}  // namespace pipetrain
