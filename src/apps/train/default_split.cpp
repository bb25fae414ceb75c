// The default split of `pipetrain train`: profile the example's layers on their real inputs at
// each candidate micro-batch size (counted passes, not a time budget), then choose_split.
#include "apps/train/default_split.h"

#include <fmt/format.h>

#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/plan/plan_calibration.h"
#include "apps/plan/profile_costs.h"
#include "apps/train/split_choice.h"
#include "pipetrain/batch/microbatch.h"
#include "pipetrain/error.h"
#include "pipetrain/partition/balance.h"
#include "pipetrain/runtime/gemm.h"
#include "pipetrain/runtime/layer_profile.h"
#include "pipetrain/schedule/memory.h"

namespace pipetrain::apps {
namespace default_split_detail {

// Smallest micro-batch the default tries: fewer rows leave batch norm too few samples and
// each layer's fixed cost dominates.
constexpr int64_t kMinRows = 8;
constexpr int kMaxMicroBatches = 32;
// One warm-up pass and four timed ones per layer and size (each time is their median), and
// that profile taken kProfileRepeats times, keeping each layer's least: on a busy machine a
// median of four still catches another process's burst, which only ever adds time.
constexpr int64_t kProfilePasses = 5;
constexpr int kProfileRepeats = 3;

// Each time of `b` into `a` where it is less (the same layers and size).
void keep_least(schedule::LayerCosts& a, const schedule::LayerCosts& b) {
  for (auto field : {&schedule::LayerCosts::forward, &schedule::LayerCosts::backward_input,
                     &schedule::LayerCosts::backward_weight, &schedule::LayerCosts::optimizer})
    for (size_t i = 0; i < (a.*field).size(); ++i) (a.*field)[i] = std::min((a.*field)[i], (b.*field)[i]);
}

// The config file names one of `keys` (dotted for nested: "pipeline.partition_method").
bool config_names(const std::string& path, std::initializer_list<const char*> keys) {
  if (path.empty()) return false;
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (!j.is_object()) return false;  // make_train_config already read it; nothing to find here
  for (const std::string key : keys) {
    const auto dot = key.find('.');
    if (dot == std::string::npos ? j.contains(key)
                                 : j.contains(key.substr(0, dot)) && j[key.substr(0, dot)].is_object() &&
                                       j[key.substr(0, dot)].contains(key.substr(dot + 1)))
      return true;
  }
  return false;
}

// The intra-op threads each rank will have (the launcher's rule), for the profile's duration.
class ProfileThreads {
 public:
  ProfileThreads(int per_rank, int processes) : saved_(at::get_num_threads()) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(per_rank > 0 ? per_rank : std::max(1, cores / std::max(1, processes)));
  }
  ~ProfileThreads() { at::set_num_threads(saved_); }
  ProfileThreads(const ProfileThreads&) = delete;
  ProfileThreads& operator=(const ProfileThreads&) = delete;

 private:
  int saved_;
};

// balance-by-time's costs (forward + backward per layer, skips allowed) as planner costs: the
// backward taken as twice the forward, no bytes (the split is by time; transfers by latency).
schedule::LayerCosts time_costs_of(const examples::Example& ex, uint64_t seed, const Batch& sample) {
  auto built = examples::build_model(ex, seed);
  torch::nn::Sequential model;
  for (auto& m : built.modules) model->push_back(m);
  TimeProfileOptions o;
  o.budget = std::chrono::milliseconds(0);
  o.min_passes = kProfilePasses;
  const auto t = time_costs(model, sample, o);
  schedule::LayerCosts c;
  for (double s : t) {
    c.forward.push_back(s / 3);
    c.backward_input.push_back(2 * s / 3);
  }
  const auto n = t.size();
  c.backward_weight.assign(n, 0.0);
  c.optimizer.assign(n, 0.0);
  c.activation_bytes.assign(n, 0.0);
  c.output_bytes.assign(n, 0.0);
  c.param_bytes.assign(n, 0.0);
  return c;
}

}  // namespace default_split_detail

namespace dsd = default_split_detail;

std::string choose_train_split(TrainArgs& args, const examples::Example& ex, const EngineConfig& config,
                               int processes) {
  const int64_t m0 = config.gradient_accumulation_steps, mbs0 = config.train_micro_batch_size_per_gpu;
  const std::string kept = fmt::format("{} micro-batches of {}", m0, mbs0);
  if (!args.plan.empty()) return fmt::format("split {} from --plan {}, {}", format_balance(config.pipeline.balance), args.plan, kept);
  if (!args.balance.empty()) return fmt::format("split {} given by --balance, {}", format_balance(args.balance), kept);
  if (dsd::config_names(args.config_file, {"pipeline.partition_method", "pipeline.balance"}))
    return fmt::format("split by the config's partition_method \"{}\" ({}), {}", config.pipeline.partition_method,
                       args.config_file, kept);
  if (config.tensor_parallel.size > 1)
    return fmt::format("split by partition_method \"{}\" (tensor-parallel layers are not profiled; --balance chooses "
                       "another), {}",
                       config.pipeline.partition_method, kept);
  if (config.pipeline.activation_checkpoint_interval > 0)
    return fmt::format("split by partition_method \"{}\" (the config checkpoints activations every {} layers, which "
                       "the profile does not; --balance chooses another), {}",
                       config.pipeline.partition_method, config.pipeline.activation_checkpoint_interval, kept);
  const bool micro_given = args.micro_batches > 0 || args.micro_batch_size > 0 ||
                           dsd::config_names(args.config_file, {"train_batch_size", "train_micro_batch_size_per_gpu",
                                                           "gradient_accumulation_steps"});
  const int stages = static_cast<int>(config.pipeline.stages);
  const int64_t rows = m0 * mbs0;
  std::vector<int> counts;
  if (micro_given) {
    counts.push_back(static_cast<int>(m0));
  } else {
    // The example's count and its doublings: fewer, larger micro-batches only add bubble.
    counts.push_back(static_cast<int>(m0));
    for (int64_t m = 2 * m0; m <= dsd::kMaxMicroBatches && rows % m == 0 && rows / m >= dsd::kMinRows; m *= 2)
      counts.push_back(static_cast<int>(m));
  }

  // A micro-batch of real inputs, cut at each candidate size: from the evaluation set where its
  // micro-batches are as large (the cnn's test set is a sixth of its training set to read).
  Batch inputs;
  if (ex.eval_micro_batches && ex.eval_micro_batches(0) > 0) inputs = ex.eval_micro_batch(0, 0).inputs;
  if (inputs.empty() || inputs.rows() < mbs0) inputs = ex.train_micro_batch(0, 0, 0).inputs;
  std::vector<torch::Tensor> first_rows;
  for (const auto& t : inputs.tensors()) first_rows.push_back(t.slice(0, 0, mbs0).contiguous());
  const Batch sample_of_m0 = inputs.with(first_rows);

  const Calibration cal = calibration();
  SplitRequest r;
  r.search.processes = processes;
  r.search.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  r.search.batch_rows = static_cast<int>(rows);
  r.search.link = cal.link;
  r.search.step_overhead_s = cal.step_overhead_s;
  r.search.shared_efficiency = cal.shared_efficiency;
  r.search.shared_message_s = cal.shared_message_s;
  r.search.defer_weights = config.pipeline.deferred_linear;
  r.search.optimizer_state_factor = schedule::optimizer_state_factor(config.optimizer.type, config.optimizer.momentum);
  r.kind = schedule::parse_kind(config.pipeline.schedule);
  r.stages = stages;
  r.chunks = config.pipeline.chunks > 1 ? static_cast<int>(config.pipeline.chunks) : 0;
  r.rows = rows;
  {
    dsd::ProfileThreads threads(args.threads_per_rank, processes);
    runtime::LayerProfileOptions po;
    po.budget = std::chrono::milliseconds(0);
    po.min_passes = dsd::kProfilePasses;
    po.stage.deferred_linear = config.pipeline.deferred_linear;
    po.stage.gemm_kernel = runtime::parse_gemm_kernel(config.pipeline.gemm_kernel);
    po.optimizer = config.optimizer.type;
    // The optimizer's time is the same for every candidate: time it warm rather than stream
    // 64 MiB past each layer per pass, which would make the profile seconds longer.
    po.evict_bytes = 0;
    const bool skips = !skip_plan(ex.layers).empty();
    if (skips) r.source = "measured layer times (balance-by-time)";
    for (int repeat = 0; repeat < dsd::kProfileRepeats; ++repeat) {
      for (int m : counts) {
        const Batch sample = scatter(sample_of_m0, m / m0).front();
        schedule::LayerCosts costs;
        if (skips) {
          costs = dsd::time_costs_of(ex, config.seed, sample);
        } else {
          const auto profile = runtime::profile_layers(ex.layers, sample, po);
          r.search.fill_waits = profile.accumulates_natively;
          costs = layer_costs(profile);
        }
        if (repeat == 0) r.search.costs[m] = std::move(costs);
        else dsd::keep_least(r.search.costs[m], costs);
      }
    }
  }
  const SplitChoice c = choose_split(r);
  args.balance = c.balance;
  if (!micro_given) {
    args.micro_batches = c.micro_batches;
    args.micro_batch_size = static_cast<int>(c.micro_batch_size);
  }
  return c.line + (micro_given ? " (micro-batches as given)" : "");
}

}  // namespace pipetrain::apps
