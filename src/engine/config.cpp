// The engine's JSON configuration, with DeepSpeed's key names where they exist.
#include "pipetrain/engine/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

using nlohmann::json;

// Reads one JSON object strictly: typed getters, and a final check that names unknown keys.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path, std::string origin)
      : object_(object), path_(std::move(path)), origin_(std::move(origin)) {
    if (!object_.is_object()) fail(path_.empty() ? "the config" : path_, "must be a JSON object");
  }

  bool has(const std::string& key) {
    known_.insert(key);
    return object_.contains(key) && !object_.at(key).is_null();
  }

  int64_t integer(const std::string& key, int64_t fallback, int64_t min_value) {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < min_value) {
      fail(name(key), "must be an integer >= " + std::to_string(min_value) + ", got " + v.dump());
    }
    return v.get<int64_t>();
  }

  double number(const std::string& key, double fallback, double min_value) {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_number() || v.get<double>() < min_value) {
      fail(name(key), "must be a number >= " + format_number(min_value) + ", got " + v.dump());
    }
    return v.get<double>();
  }

  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_boolean()) fail(name(key), "must be true or false, got " + v.dump());
    return v.get<bool>();
  }

  std::string string(const std::string& key, const std::string& fallback,
                     const std::vector<std::string>& allowed = {}) {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_string()) fail(name(key), "must be a string, got " + v.dump());
    const auto s = v.get<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
      fail(name(key), "is \"" + s + "\"; expected one of " + join(allowed));
    }
    return s;
  }

  std::vector<int64_t> integers(const std::string& key, int64_t min_value) {
    if (!has(key)) return {};
    const json& v = object_.at(key);
    bool ok = v.is_array();
    std::vector<int64_t> out;
    for (size_t i = 0; ok && i < v.size(); ++i) {
      ok = v[i].is_number_integer() && v[i].get<int64_t>() >= min_value;
      if (ok) out.push_back(v[i].get<int64_t>());
    }
    if (!ok) {
      fail(name(key), "must be a list of integers >= " + std::to_string(min_value) + ", got " + v.dump());
    }
    return out;
  }

  std::vector<double> numbers(const std::string& key, size_t count) {
    const json& v = object_.at(key);
    if (!v.is_array() || v.size() != count || !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number(); })) {
      fail(name(key), "must be a list of " + std::to_string(count) + " numbers, got " + v.dump());
    }
    return v.get<std::vector<double>>();
  }

  ObjectReader object(const std::string& key) {
    known_.insert(key);
    return ObjectReader(object_.at(key), name(key), origin_);
  }

  // Every key not asked for is an error: DeepSpeed silently ignores typos, we do not.
  void finish() const {
    std::vector<std::string> unknown;
    for (const auto& item : object_.items()) {
      if (!known_.count(item.key())) unknown.push_back(item.key());
    }
    if (unknown.empty()) return;
    std::vector<std::string> known(known_.begin(), known_.end());
    throw ConfigError(origin_ + ": unknown key" + (unknown.size() > 1 ? "s " : " ") +
                      join(prefixed(unknown)) + (path_.empty() ? "" : " in \"" + path_ + "\"") +
                      "; known keys here: " + join(known) + ". Remove or rename " +
                      (unknown.size() > 1 ? "them" : "it"));
  }

  [[noreturn]] void fail(const std::string& what, const std::string& problem) const {
    throw ConfigError(origin_ + ": \"" + what + "\" " + problem);
  }

 private:
  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back("\"" + name(k) + "\"");
    return out;
  }

  static std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
    return out;
  }

  static std::string format_number(double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  }

  const json& object_;
  std::string path_;
  std::string origin_;
  std::set<std::string> known_;
};

const std::vector<std::string> kOptimizers{"SGD", "Adam", "AdamW", "RMSprop", "Adagrad"};
const std::vector<std::string> kSchedulers{"WarmupLR", "WarmupDecayLR"};

OptimizerConfig read_optimizer(ObjectReader& reader) {
  OptimizerConfig opt;
  opt.type = reader.string("type", opt.type, kOptimizers);
  if (reader.has("params")) {
    auto params = reader.object("params");
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
    params.finish();
  }
  reader.finish();
  return opt;
}

SchedulerConfig read_scheduler(ObjectReader& reader) {
  SchedulerConfig s;
  s.type = reader.string("type", "", kSchedulers);
  if (reader.has("params")) {
    auto params = reader.object("params");
    s.warmup_min_lr = params.number("warmup_min_lr", s.warmup_min_lr, 0.0);
    s.warmup_max_lr = params.number("warmup_max_lr", s.warmup_max_lr, 0.0);
    s.warmup_num_steps = params.integer("warmup_num_steps", s.warmup_num_steps, 0);
    s.total_num_steps = params.integer("total_num_steps", s.total_num_steps, 0);
    params.finish();
  }
  if (s.type == "WarmupDecayLR" && s.total_num_steps <= s.warmup_num_steps) {
    reader.fail("scheduler.params.total_num_steps",
                "must be greater than warmup_num_steps (" + std::to_string(s.warmup_num_steps) +
                    ") for WarmupDecayLR, got " + std::to_string(s.total_num_steps));
  }
  reader.finish();
  return s;
}

PipelineConfig read_pipeline(ObjectReader& reader) {
  PipelineConfig p;
  p.stages = reader.integer("stages", p.stages, 0);
  p.activation_checkpoint_interval =
      reader.integer("activation_checkpoint_interval", p.activation_checkpoint_interval, 0);
  p.schedule = reader.string("schedule", p.schedule);
  p.chunks = reader.integer("chunks", p.chunks, 1);
  p.partition_method = reader.string("partition_method", p.partition_method);
  p.balance = reader.integers("balance", 1);
  p.comm_timeout_s = reader.number("comm_timeout_s", p.comm_timeout_s, 0.001);
  p.on_nonfinite_loss = reader.string("on_nonfinite_loss", p.on_nonfinite_loss, {"error", "skip"});
  p.deferred_linear = reader.boolean("deferred_linear", p.deferred_linear);
  p.gemm_kernel = reader.string("gemm_kernel", p.gemm_kernel, {"auto", "native", "onednn", "blas"});
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
  const double warm = warmup_num_steps > 0 ? std::min(1.0, static_cast<double>(step) / warmup_num_steps) : 1.0;
  const double lr = warmup_min_lr + (warmup_max_lr - warmup_min_lr) * warm;
  if (type == "WarmupDecayLR" && step >= warmup_num_steps) {
    const double left = static_cast<double>(total_num_steps - step) /
                        static_cast<double>(total_num_steps - warmup_num_steps);
    return warmup_max_lr * std::max(0.0, left);
  }
  return lr;
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

EngineConfig EngineConfig::from_json_text(const std::string& text, const std::string& origin) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(origin + ": not valid JSON (" + e.what() + ")");
  }
  ObjectReader reader(doc, "", origin);
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
  if (reader.has("bf16")) {
    auto r = reader.object("bf16");
    c.bf16.enabled = r.boolean("enabled", false);
    r.finish();
  }
  reader.finish();
  (void)c.precision();  // both enabled: the error names the two keys
  return c;
}

EngineConfig EngineConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read config file " + path + "; check the path");
  std::stringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
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
                                  {"total_num_steps", scheduler.total_num_steps}}}};
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
            {"device", pipeline.device}};
  if (!pipeline.balance.empty()) p["balance"] = pipeline.balance;
  j["pipeline"] = p;
  j["bf16"] = {{"enabled", bf16.enabled}};
  j["fp16"] = {{"enabled", fp16.enabled},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"min_loss_scale", fp16.min_loss_scale}};
  return j.dump(2);
}

}  // namespace pipetrain
