// The engine's JSON configuration, with DeepSpeed's key names where they exist.
#include "pipetrain/engine/config.h"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config_reader.h"
#include "deepspeed_keys.h"
#include "pipetrain/error.h"
#include "pipetrain/util/log.h"

namespace pipetrain {
namespace {

using nlohmann::json;
using config_detail::ObjectReader;
namespace deepspeed = config_detail::deepspeed;

const std::vector<std::string> kOptimizers{"SGD", "Adam", "AdamW", "RMSprop", "Adagrad"};
const std::vector<std::string> kSchedulers{"WarmupLR", "WarmupDecayLR"};

OptimizerConfig read_optimizer(ObjectReader& reader) {
  OptimizerConfig opt;
  opt.type = reader.string("type", opt.type, kOptimizers);
  if (reader.has("params")) {
    auto params = reader.object("params");
    params.accept_auto({"lr", "betas", "eps", "weight_decay"}).ignore(deepspeed::kOptimizerParams);
    opt.lr = params.number("lr", opt.lr, 0.0);
    opt.momentum = params.number("momentum", opt.momentum, 0.0);
    opt.nesterov = params.boolean("nesterov", opt.nesterov);
    opt.weight_decay = params.number("weight_decay", opt.weight_decay, 0.0);
    opt.eps = params.number("eps", opt.eps, 0.0);
    opt.alpha = params.number("alpha", opt.alpha, 0.0);
    if (params.has("betas")) {
      const auto betas = params.numbers("betas", 2);
      opt.betas = {betas[0], betas[1]};
    }
    // DeepSpeed's "Adam" decouples the weight decay (AdamW) unless adam_w_mode is false; without
    // weight decay the two are the same.
    const bool adam_w_mode = params.boolean("adam_w_mode", true);
    if (opt.type == "Adam" && adam_w_mode && opt.weight_decay > 0) opt.type = "AdamW";
    params.finish();
  }
  reader.ignore(deepspeed::kOptimizer).finish();
  return opt;
}

SchedulerConfig read_scheduler(ObjectReader& reader) {
  SchedulerConfig s;
  s.type = reader.string("type", "", kSchedulers);
  bool total_is_auto = false;
  if (reader.has("params")) {
    auto params = reader.object("params");
    params.accept_auto({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps"})
        .ignore(deepspeed::kSchedulerParams);
    s.warmup_min_lr = params.number("warmup_min_lr", s.warmup_min_lr, 0.0);
    s.warmup_max_lr = params.number("warmup_max_lr", s.warmup_max_lr, 0.0);
    s.warmup_num_steps = params.integer("warmup_num_steps", s.warmup_num_steps, 0);
    s.total_num_steps = params.integer("total_num_steps", s.total_num_steps, 0);
    total_is_auto = params.is_auto("total_num_steps");
    s.warmup_type = params.string("warmup_type", s.warmup_type, {"log", "linear"});
    params.finish();
  }
  if (s.type == "WarmupDecayLR" && s.total_num_steps <= s.warmup_num_steps) {
    reader.fail("scheduler.params.total_num_steps",
                total_is_auto
                    ? "is \"auto\", which pipetrain cannot derive for WarmupDecayLR (the config does not "
                      "give the run's length); give the number of steps, greater than warmup_num_steps (" +
                          std::to_string(s.warmup_num_steps) + ")"
                    : "must be greater than warmup_num_steps (" + std::to_string(s.warmup_num_steps) +
                          ") for WarmupDecayLR, got " + std::to_string(s.total_num_steps));
  }
  reader.finish();
  return s;
}

PipelineConfig read_pipeline(ObjectReader& reader) {
  PipelineConfig p;
  reader.accept_auto({"stages"}).ignore(deepspeed::kPipeline);
  p.stages = reader.integer("stages", p.stages, 0);
  p.activation_checkpoint_interval =
      reader.integer("activation_checkpoint_interval", p.activation_checkpoint_interval, 0);
  p.schedule = reader.string("schedule", p.schedule);
  p.chunks = reader.integer("chunks", p.chunks, 1);
  p.schedule_csv = reader.string("schedule_csv", p.schedule_csv);
  p.partition_method = reader.string("partition_method", p.partition_method);
  p.balance = reader.integers("balance", 1);
  p.comm_timeout_s = reader.number("comm_timeout_s", p.comm_timeout_s, 0.001);
  p.on_nonfinite_loss = reader.string("on_nonfinite_loss", p.on_nonfinite_loss, {"error", "skip"});
  p.deferred_linear = reader.boolean("deferred_linear", p.deferred_linear);
  p.gemm_kernel = reader.string("gemm_kernel", p.gemm_kernel, {"auto", "native", "onednn", "blas"});
  p.bind_cores = reader.string("bind_cores", p.bind_cores, {"auto", "on", "off"});
  p.device = reader.string("device", p.device);
  {
    const auto& d = p.device;
    const bool cuda_n = d.rfind("cuda:", 0) == 0 && d.size() > 5 &&
                        d.find_first_not_of("0123456789", 5) == std::string::npos;
    if (!(d == "auto" || d == "cpu" || d == "cuda" || cuda_n)) {
      reader.fail("pipeline.device", "is \"" + d + "\"; expected auto, cpu, cuda or cuda:N");
    }
  }
  const auto& m = p.partition_method;
  if (!(m == "parameters" || m == "uniform" || m == "balance" || m.rfind("type:", 0) == 0)) {
    reader.fail("pipeline.partition_method",
                "is \"" + m + "\"; expected parameters, uniform, balance or type:REGEX");
  }
  if (m == "balance" && p.balance.empty()) {
    reader.fail("pipeline.balance", "is required when partition_method is \"balance\" (layers per stage)");
  }
  reader.finish();
  return p;
}

Fp16Config read_fp16(ObjectReader& reader) {
  Fp16Config f;
  reader.accept_auto({"enabled"}).ignore(deepspeed::kFp16);
  f.enabled = reader.boolean("enabled", f.enabled);
  f.loss_scale = reader.number("loss_scale", f.loss_scale, 0.0);
  f.initial_scale_power = reader.integer("initial_scale_power", f.initial_scale_power, 0);
  f.loss_scale_window = reader.integer("loss_scale_window", f.loss_scale_window, 1);
  f.hysteresis = reader.integer("hysteresis", f.hysteresis, 1);
  f.min_loss_scale = reader.number("min_loss_scale", f.min_loss_scale, 0.0);
  if (f.initial_scale_power > 60) {
    reader.fail("fp16.initial_scale_power", "is " + std::to_string(f.initial_scale_power) +
                                                "; 2^power must fit a float (use at most 60; DeepSpeed's default is 16)");
  }
  reader.finish();
  return f;
}

Bf16Config read_bf16(ObjectReader& reader) {
  Bf16Config b;
  reader.accept_auto({"enabled"}).ignore(deepspeed::kBf16);
  b.enabled = reader.boolean("enabled", b.enabled);
  reader.finish();
  return b;
}

// The block, or DeepSpeed's deprecated boolean form (true = stage 1).
ZeroConfig read_zero(ObjectReader& parent) {
  ZeroConfig z;
  if (parent.value("zero_optimization").is_boolean()) {
    z.stage = parent.boolean("zero_optimization", false) ? 1 : 0;
  } else {
    auto reader = parent.object("zero_optimization");
    reader.accept_auto(deepspeed::kZeroOptimizationAuto).ignore(deepspeed::kZeroOptimization);
    z.stage = reader.integer("stage", z.stage, 0);
    reader.finish();
  }
  z.check(parent.origin());
  return z;
}

// DeepSpeed's AutoTP training block names the size "autotp_size"; its inference config "tp_size".
TensorParallelConfig read_tensor_parallel(ObjectReader& reader) {
  TensorParallelConfig t;
  if (reader.has("autotp_size") && reader.has("tp_size")) {
    reader.fail("tp_size", "and \"autotp_size\" both give the tensor-parallel size; keep one of them");
  }
  for (const char* key : {"autotp_size", "tp_size"}) t.size = reader.integer(key, t.size, 1);
  reader.finish();
  return t;
}

TensorBoardConfig read_tensorboard(ObjectReader& reader) {
  TensorBoardConfig t;
  t.enabled = reader.boolean("enabled", t.enabled);
  t.output_path = reader.string("output_path", t.output_path);
  t.job_name = reader.string("job_name", t.job_name);
  if (t.job_name.empty()) {
    reader.fail("tensorboard.job_name", "is empty; give a name (the directory inside output_path)");
  }
  reader.finish();
  return t;
}

// wandb, csv_monitor, comet: DeepSpeed monitors pipetrain does not write.
void read_monitor(ObjectReader& reader, const std::string& key, const std::string& what,
                  const std::vector<std::string>& keys) {
  for (const auto& k : keys) reader.has(k);  // accepted, and meaningless here
  if (reader.boolean("enabled", false)) {
    reader.warn("\"" + key + "\" is enabled, but pipetrain does not log to " + what +
                ": not supported; ignored (pipetrain train writes TensorBoard event files: see \"tensorboard\")");
  }
  reader.finish();
}

}  // namespace

std::string EngineConfig::precision() const {
  if (bf16.enabled && fp16.enabled) {
    throw ConfigError("both bf16.enabled and fp16.enabled are true; enable one of them");
  }
  return bf16.enabled ? "bf16" : fp16.enabled ? "fp16" : "fp32";
}

void EngineConfig::set_precision(const std::string& p) {
  if (p != "fp32" && p != "bf16" && p != "fp16") {
    throw ConfigError("precision \"" + p + "\" is not one of fp32, bf16, fp16");
  }
  bf16.enabled = p == "bf16";
  fp16.enabled = p == "fp16";
}

double SchedulerConfig::lr_at(int64_t step, double base_lr) const {
  if (type.empty()) return base_lr;
  // DeepSpeed's WarmupLR / WarmupDecayLR: min_lr + (max_lr - min_lr) x gamma.
  const int64_t warmup = std::max<int64_t>(2, warmup_num_steps);
  double gamma = 1.0;
  if (step < warmup) {
    gamma = warmup_type == "linear" ? static_cast<double>(step) / static_cast<double>(warmup)
                                    : std::log(static_cast<double>(step) + 1.0) / std::log(static_cast<double>(warmup));
  } else if (type == "WarmupDecayLR") {
    gamma = std::max(0.0, static_cast<double>(total_num_steps - step) /
                              static_cast<double>(std::max<int64_t>(1, total_num_steps - warmup)));
  }
  return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma;
}

void EngineConfig::resolve_batch_sizes(int64_t replicas) {
  if (replicas < 1) throw ConfigError("data-parallel replicas must be >= 1, got " + std::to_string(replicas));
  int64_t& tbs = train_batch_size;
  int64_t& mbs = train_micro_batch_size_per_gpu;
  int64_t& gas = gradient_accumulation_steps;
  auto divide = [&](int64_t total, int64_t by, const char* what) {
    if (by <= 0 || total % by != 0) {
      throw ConfigError("train_batch_size " + std::to_string(tbs) + " is not divisible by " + what +
                        " (" + std::to_string(by) + "); set train_batch_size = "
                        "train_micro_batch_size_per_gpu x gradient_accumulation_steps x replicas");
    }
    return total / by;
  };
  if (tbs > 0 && mbs > 0 && gas > 0) {
    // all three given: checked below
  } else if (tbs > 0 && mbs > 0) {
    gas = divide(tbs, mbs * replicas, "train_micro_batch_size_per_gpu x replicas");
  } else if (tbs > 0 && gas > 0) {
    mbs = divide(tbs, gas * replicas, "gradient_accumulation_steps x replicas");
  } else if (mbs > 0 && gas > 0) {
    tbs = mbs * gas * replicas;
  } else if (tbs > 0) {
    gas = 1;
    mbs = divide(tbs, replicas, "replicas");
  } else if (mbs > 0) {
    gas = 1;
    tbs = mbs * replicas;
  } else {
    throw ConfigError("no batch size given: set train_batch_size or train_micro_batch_size_per_gpu "
                      "(and optionally gradient_accumulation_steps)");
  }
  if (tbs != mbs * gas * replicas) {
    throw ConfigError("inconsistent batch sizes: train_batch_size " + std::to_string(tbs) +
                      " != train_micro_batch_size_per_gpu " + std::to_string(mbs) +
                      " x gradient_accumulation_steps " + std::to_string(gas) + " x replicas " +
                      std::to_string(replicas) + " = " + std::to_string(mbs * gas * replicas) +
                      "; fix one of them or leave one out to have it derived");
  }
}

void ZeroConfig::check(const std::string& origin) const {
  const std::string key = origin + ": \"zero_optimization.stage\" is " + std::to_string(stage);
  if (stage == 2 || stage == 3) {
    throw ConfigError(key + ": ZeRO stage 2/3 does not combine with pipeline parallelism (as in DeepSpeed); "
                      "use stage 0 or 1");
  }
  if (stage != 0 && stage != 1) throw ConfigError(key + ": DeepSpeed's stages are 0 to 3; use stage 0 or 1");
}

EngineConfig EngineConfig::from_json_text(const std::string& text, const std::string& origin, ConfigWarnings warn) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(origin + ": not valid JSON (" + e.what() + ")");
  }
  ObjectReader reader(doc, origin);
  reader.accept_auto({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                      "gradient_clipping"})
      .ignore(deepspeed::kTopLevel);
  EngineConfig c;
  c.train_batch_size = reader.integer("train_batch_size", 0, 1);
  c.train_micro_batch_size_per_gpu = reader.integer("train_micro_batch_size_per_gpu", 0, 1);
  c.gradient_accumulation_steps = reader.integer("gradient_accumulation_steps", 0, 1);
  c.steps_per_print = reader.integer("steps_per_print", c.steps_per_print, 1);
  c.wall_clock_breakdown = reader.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  c.gradient_clipping = reader.number("gradient_clipping", c.gradient_clipping, 0.0);
  c.seed = static_cast<uint64_t>(reader.integer("seed", static_cast<int64_t>(c.seed), 0));
  if (reader.has("optimizer")) {
    auto r = reader.object("optimizer");
    c.optimizer = read_optimizer(r);
  }
  if (reader.has("scheduler")) {
    auto r = reader.object("scheduler");
    c.scheduler = read_scheduler(r);
  }
  if (reader.has("pipeline")) {
    auto r = reader.object("pipeline");
    c.pipeline = read_pipeline(r);
  }
  if (reader.has("fp16")) {
    auto r = reader.object("fp16");
    c.fp16 = read_fp16(r);
  }
  // "bfloat16" is DeepSpeed's older name of the block.
  if (reader.has("bf16") && reader.has("bfloat16")) {
    reader.fail("bfloat16", "is the older name of \"bf16\", which is also given; keep one of them");
  }
  for (const char* key : {"bf16", "bfloat16"}) {
    if (!reader.has(key)) continue;
    auto r = reader.object(key);
    c.bf16 = read_bf16(r);
  }
  if (reader.has("zero_optimization")) c.zero_optimization = read_zero(reader);
  if (reader.has("tensor_parallel")) {
    auto r = reader.object("tensor_parallel");
    c.tensor_parallel = read_tensor_parallel(r);
  }
  if (reader.has("tensorboard")) {
    auto r = reader.object("tensorboard");
    c.tensorboard = read_tensorboard(r);
  }
  const std::vector<std::array<std::string, 2>> monitors{
      {"wandb", "Weights & Biases"}, {"csv_monitor", "CSV files"}, {"comet", "Comet"}};
  for (const auto& [key, what] : monitors) {
    if (!reader.has(key)) continue;
    auto r = reader.object(key);
    read_monitor(r, key, what,
                 key == "wandb" ? deepspeed::kWandb : key == "comet" ? deepspeed::kComet : deepspeed::kCsvMonitor);
  }
  // DeepSpeed reads its top-level keys one by one and never sees the others (a typo included):
  // the Python front end, standing in for it, names them in a warning instead of failing.
  std::vector<std::string> unknown_top_level;
  if (warn == ConfigWarnings::DeepSpeed) unknown_top_level = reader.unknown();
  if (unknown_top_level.empty()) reader.finish();
  (void)c.precision();  // both enabled: the error names the two keys

  if (!unknown_top_level.empty()) {
    c.warnings.push_back(origin + ": unknown key" + (unknown_top_level.size() > 1 ? "s " : " ") +
                         ObjectReader::quoted(unknown_top_level) +
                         " ignored, as DeepSpeed ignores them; check the spelling if " +
                         (unknown_top_level.size() > 1 ? "they were" : "it was") + " meant to do something");
  }

  if (!reader.ignored().empty()) {
    c.warnings.push_back(origin + ": DeepSpeed keys that pipetrain does not implement are ignored: " +
                         ObjectReader::quoted(reader.ignored()));
  }
  c.warnings.insert(c.warnings.end(), reader.warnings().begin(), reader.warnings().end());
  if (warn == ConfigWarnings::Log) {
    for (const auto& w : c.warnings) util::log_warn(w);
  }
  return c;
}

EngineConfig EngineConfig::from_file(const std::string& path, ConfigWarnings warn) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read config file " + path + "; check the path");
  std::stringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path, warn);
}

std::string EngineConfig::to_json_text() const {
  json j;
  j["train_batch_size"] = train_batch_size;
  j["train_micro_batch_size_per_gpu"] = train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = gradient_accumulation_steps;
  j["steps_per_print"] = steps_per_print;
  j["wall_clock_breakdown"] = wall_clock_breakdown;
  j["gradient_clipping"] = gradient_clipping;
  j["seed"] = seed;
  j["optimizer"] = {{"type", optimizer.type},
                    {"params", {{"lr", optimizer.lr}, {"momentum", optimizer.momentum},
                                {"nesterov", optimizer.nesterov}, {"weight_decay", optimizer.weight_decay},
                                {"betas", optimizer.betas}, {"eps", optimizer.eps}, {"alpha", optimizer.alpha}}}};
  if (!scheduler.type.empty()) {
    j["scheduler"] = {{"type", scheduler.type},
                      {"params", {{"warmup_min_lr", scheduler.warmup_min_lr},
                                  {"warmup_max_lr", scheduler.warmup_max_lr},
                                  {"warmup_num_steps", scheduler.warmup_num_steps},
                                  {"total_num_steps", scheduler.total_num_steps},
                                  {"warmup_type", scheduler.warmup_type}}}};
  }
  json p = {{"stages", pipeline.stages},
            {"activation_checkpoint_interval", pipeline.activation_checkpoint_interval},
            {"schedule", pipeline.schedule},
            {"chunks", pipeline.chunks},
            {"partition_method", pipeline.partition_method},
            {"comm_timeout_s", pipeline.comm_timeout_s},
            {"on_nonfinite_loss", pipeline.on_nonfinite_loss},
            {"deferred_linear", pipeline.deferred_linear},
            {"gemm_kernel", pipeline.gemm_kernel},
            {"device", pipeline.device},
            {"bind_cores", pipeline.bind_cores}};
  if (!pipeline.balance.empty()) p["balance"] = pipeline.balance;
  if (!pipeline.schedule_csv.empty()) p["schedule_csv"] = pipeline.schedule_csv;
  j["pipeline"] = p;
  j["bf16"] = {{"enabled", bf16.enabled}};
  j["fp16"] = {{"enabled", fp16.enabled},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"min_loss_scale", fp16.min_loss_scale}};
  j["zero_optimization"] = {{"stage", zero_optimization.stage}};
  j["tensor_parallel"] = {{"autotp_size", tensor_parallel.size}};
  j["tensorboard"] = {{"enabled", tensorboard.enabled},
                      {"output_path", tensorboard.output_path},
                      {"job_name", tensorboard.job_name}};
  return j.dump(2);
}

}  // namespace pipetrain
