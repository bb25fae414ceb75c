// The engine config: DeepSpeed key names, batch-size rules, and errors that name the key.
#include "pipetrain/engine/config.h"

#include <gtest/gtest.h>

#include <random>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

std::string config_error_of(const std::string& text) {
  try {
    EngineConfig::from_json_text(text, "test.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(EngineConfig, ReadsDeepSpeedKeys) {
  auto c = EngineConfig::from_json_text(R"({
    "train_batch_size": 256, "train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 8,
    "steps_per_print": 5, "wall_clock_breakdown": true, "gradient_clipping": 1.5, "seed": 7,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.8, 0.9], "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 10}},
    "pipeline": {"activation_checkpoint_interval": 2, "schedule": "zb-h1", "partition_method": "type:Linear",
                 "comm_timeout_s": 5, "on_nonfinite_loss": "skip", "device": "cuda:1", "bind_cores": "off"}})");
  EXPECT_EQ(c.train_batch_size, 256);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.steps_per_print, 5);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.5);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.pipeline.schedule, "zb-h1");
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 2);
  EXPECT_EQ(c.pipeline.on_nonfinite_loss, "skip");
  EXPECT_EQ(c.pipeline.device, "cuda:1");
  EXPECT_EQ(EngineConfig::from_json_text("{}").pipeline.device, "auto");
  EXPECT_EQ(c.pipeline.bind_cores, "off");
  EXPECT_EQ(EngineConfig::from_json_text("{}").pipeline.bind_cores, "auto");
  c.resolve_batch_sizes(1);
  // The document it writes reads back to the same settings.
  auto again = EngineConfig::from_json_text(c.to_json_text());
  EXPECT_EQ(again.to_json_text(), c.to_json_text());
}

TEST(EngineConfig, UnknownKeysAreNamed) {
  const auto top = config_error_of(R"({"train_batch_size": 8, "train_batch_szie": 8})");
  EXPECT_NE(top.find("\"train_batch_szie\""), std::string::npos) << top;
  EXPECT_NE(top.find("test.json"), std::string::npos) << top;
  const auto nested = config_error_of(R"({"pipeline": {"activation_checkpoint_intervall": 1}})");
  EXPECT_NE(nested.find("\"pipeline.activation_checkpoint_intervall\""), std::string::npos) << nested;
  EXPECT_NE(nested.find("activation_checkpoint_interval"), std::string::npos) << nested;  // the known keys
  const auto opt = config_error_of(R"({"optimizer": {"type": "SGD", "params": {"learning_rate": 1}}})");
  EXPECT_NE(opt.find("\"optimizer.params.learning_rate\""), std::string::npos) << opt;
}

TEST(EngineConfig, WrongTypesAndValuesAreNamed) {
  EXPECT_NE(config_error_of(R"({"train_batch_size": "big"})").find("\"train_batch_size\" must be an integer"),
            std::string::npos);
  EXPECT_NE(config_error_of(R"({"optimizer": {"type": "Lion"}})").find("expected one of SGD"), std::string::npos);
  EXPECT_NE(config_error_of(R"({"pipeline": {"partition_method": "magic"}})").find("type:REGEX"), std::string::npos);
  EXPECT_NE(config_error_of(R"({"pipeline": {"partition_method": "balance"}})").find("pipeline.balance"),
            std::string::npos);
  EXPECT_NE(config_error_of(R"({"pipeline": {"balance": [2, 0]}})").find("pipeline.balance"), std::string::npos);
  for (const char* bad : {"gpu", "cuda:", "cuda:one", "CPU"}) {
    const auto e = config_error_of(std::string(R"({"pipeline": {"device": ")") + bad + "\"}}");
    EXPECT_NE(e.find("pipeline.device"), std::string::npos) << e;
    EXPECT_NE(e.find("expected auto, cpu, cuda or cuda:N"), std::string::npos) << e;
  }
  EXPECT_NE(config_error_of(R"({"pipeline": {"bind_cores": "yes"}})").find("pipeline.bind_cores"), std::string::npos);
  EXPECT_NE(config_error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(config_error_of("[1, 2]").find("must be a JSON object"), std::string::npos);
}

TEST(EngineConfig, BatchSizeRulesFollowDeepSpeed) {
  auto resolved = [](int64_t tbs, int64_t mbs, int64_t gas, int64_t replicas) {
    EngineConfig c;
    c.train_batch_size = tbs;
    c.train_micro_batch_size_per_gpu = mbs;
    c.gradient_accumulation_steps = gas;
    c.resolve_batch_sizes(replicas);
    return std::vector<int64_t>{c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps};
  };
  EXPECT_EQ(resolved(256, 32, 0, 1), (std::vector<int64_t>{256, 32, 8}));
  EXPECT_EQ(resolved(256, 0, 4, 2), (std::vector<int64_t>{256, 32, 4}));
  EXPECT_EQ(resolved(0, 16, 4, 2), (std::vector<int64_t>{128, 16, 4}));
  EXPECT_EQ(resolved(64, 0, 0, 2), (std::vector<int64_t>{64, 32, 1}));
  EXPECT_EQ(resolved(0, 8, 0, 1), (std::vector<int64_t>{8, 8, 1}));
  EXPECT_THROW(resolved(0, 0, 0, 1), ConfigError);
  EXPECT_THROW(resolved(100, 32, 0, 1), ConfigError);
  try {
    resolved(256, 32, 4, 1);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train_batch_size 256 != train_micro_batch_size_per_gpu 32 x "
                                         "gradient_accumulation_steps 4 x replicas 1 = 128"),
              std::string::npos)
        << e.what();
  }
}

TEST(EngineConfig, WarmupSchedules) {
  SchedulerConfig s;
  EXPECT_DOUBLE_EQ(s.lr_at(5, 0.1), 0.1);
  s.type = "WarmupLR";
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 1.0;
  s.warmup_num_steps = 10;
  // DeepSpeed's default warm-up is logarithmic: log(step + 1) / log(10).
  EXPECT_EQ(s.warmup_type, "log");
  EXPECT_DOUBLE_EQ(s.lr_at(0, 0.1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5, 0.1), std::log(6.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(s.lr_at(9, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(50, 0.1), 1.0);
  s.warmup_type = "linear";
  EXPECT_DOUBLE_EQ(s.lr_at(0, 0.1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(50, 0.1), 1.0);
  // A warm-up of 1 step counts as 2 (DeepSpeed's floor, which keeps log(n) > 0).
  s.warmup_num_steps = 1;
  EXPECT_DOUBLE_EQ(s.lr_at(1, 0.1), 0.5);
  s.warmup_num_steps = 10;
  s.type = "WarmupDecayLR";
  s.total_num_steps = 20;
  EXPECT_DOUBLE_EQ(s.lr_at(15, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(25, 0.1), 0.0);
  // The decay ends at warmup_min_lr, not at 0.
  s.warmup_min_lr = 0.2;
  EXPECT_DOUBLE_EQ(s.lr_at(15, 0.1), 0.6);
  EXPECT_DOUBLE_EQ(s.lr_at(25, 0.1), 0.2);
  EXPECT_NE(config_error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})").find("warmup_type"),
            std::string::npos);
  EXPECT_NE(config_error_of(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})")
                .find("total_num_steps"),
            std::string::npos);
}

// Bounded fuzzing: mutated and truncated configs either parse or raise ConfigError; nothing
// else escapes (no nlohmann exception, no crash), whatever the bytes.
TEST(EngineConfig, FuzzMutatedDocumentsGiveConfigErrorsOnly) {
  const std::string good = R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 8, "gradient_clipping": 1.0, "seed": 3,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.99], "eps": 1e-8}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5, "total_num_steps": 50}},
    "pipeline": {"stages": 2, "schedule": "1f1b", "partition_method": "uniform", "comm_timeout_s": 30,
                 "activation_checkpoint_interval": 1, "deferred_linear": true, "gemm_kernel": "auto"}})";
  ASSERT_EQ(config_error_of(good), "");
  const std::string alphabet = "{}[]\",:0123456789.-eE truefalsnul\\x";
  std::mt19937 rng(2026);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % text.size();
      switch (rng() % 4) {
        case 0: text[at] = alphabet[rng() % alphabet.size()]; break;                  // replace
        case 1: text.insert(at, 1, alphabet[rng() % alphabet.size()]); break;         // insert
        case 2: text.erase(at, 1 + rng() % 8); break;                                  // delete
        default: text[at] = static_cast<char>(rng() % 256); break;                     // any byte
      }
      if (text.empty()) text = "{";
    }
    if (rng() % 8 == 0) text.resize(rng() % text.size());
    try {
      EngineConfig::from_json_text(text, "fuzz.json");
      ++parsed;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("fuzz.json"), std::string::npos) << e.what();
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ConfigError: " << e.what() << "\ninput: " << text;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace pipetrain
