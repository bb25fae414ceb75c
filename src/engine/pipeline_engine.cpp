// PipelineEngine: construction, train_batch and eval_batch.
#include "pipetrain/engine/pipeline_engine.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "pipetrain/comm/clock_sync.h"
#include "pipetrain/comm/rank_info.h"
#include "pipetrain/comm/threads.h"
#include "pipetrain/engine/optimizer.h"
#include "batch_broadcast.h"
#include "pipetrain/error.h"
#include "pipetrain/runtime/autocast.h"
#include "pipetrain/runtime/device.h"
#include "pipetrain/runtime/gemm.h"
#include "pipetrain/runtime/rng.h"
#include "pipetrain/schedule/defer_weights.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/torch_csv.h"
#include "pipetrain/util/log.h"

namespace pipetrain {

namespace {

// Steady: a step's duration and its events must not jump when NTP steps the wall clock.
double wall_seconds() { return comm::steady_seconds(); }

int resolve_stages(const PipelineModule& module, const EngineConfig& config, int world) {
  const int64_t from_module = module.num_stages;
  const int64_t from_config = config.pipeline.stages;
  if (from_module > 0 && from_config > 0 && from_module != from_config) {
    throw ConfigError(fmt::format(
        "the PipelineModule asks for {} stages but pipeline.stages in the config is {}; set one of them",
        from_module, from_config));
  }
  const int64_t stages = from_module > 0 ? from_module : from_config > 0 ? from_config : world;
  return static_cast<int>(stages);
}

int tensor_size(const EngineConfig& config) {
  if (config.tensor_parallel.size < 1) {
    throw ConfigError(fmt::format("tensor_parallel size is {}; it must be >= 1", config.tensor_parallel.size));
  }
  return static_cast<int>(config.tensor_parallel.size);
}

// torch's CSV fixes stages and micro-batches itself: they must be the run's.
schedule::Schedule read_train_schedule_csv(const EngineConfig& config, int stages) {
  const auto& path = config.pipeline.schedule_csv;
  auto sched = schedule::read_torch_csv(path);
  if (!sched.training)
    throw ConfigError(fmt::format("pipeline.schedule_csv {}: the schedule has no backward actions; a training step needs them", path));
  if (sched.num_stages() != stages)
    throw ConfigError(fmt::format("pipeline.schedule_csv {}: {} rows (ranks), but the pipeline has {} stages; write one row per stage",
                                  path, sched.num_stages(), stages));
  if (sched.num_micro_batches != config.gradient_accumulation_steps)
    throw ConfigError(fmt::format(
        "pipeline.schedule_csv {}: the schedule runs {} micro-batches, gradient_accumulation_steps is {}; set it to {}", path,
        sched.num_micro_batches, config.gradient_accumulation_steps, sched.num_micro_batches));
  return sched;
}

// The parameters a tied key shares across stages: those its specs name (DeepSpeed's
// tied_weight_attr), or all of the module's. The others stay each stage's own, so they are
// neither broadcast at start nor all-reduced with the key's group.
std::vector<torch::Tensor> tied_parameters(const std::vector<LayerSpec>& layers, const std::string& key,
                                           const torch::nn::Module& module) {
  const LayerSpec* named = nullptr;
  for (const auto& spec : layers) {
    if (spec.tied_key != key) continue;
    if (named && named->tied_params != spec.tied_params) {
      throw ConfigError(fmt::format("tied key '{}' names its tied parameters twice, differently: [{}] and [{}]; "
                                    "give every use of the key the same tied_weight_attr",
                                    key, fmt::join(named->tied_params, ", "), fmt::join(spec.tied_params, ", ")));
    }
    named = &spec;
  }
  if (!named || named->tied_params.empty()) return module.parameters();
  const auto all = module.named_parameters();
  std::vector<torch::Tensor> out;
  for (const auto& name : named->tied_params) {
    const auto* p = all.find(name);
    if (!p) {
      std::vector<std::string> have;
      for (const auto& item : all) have.push_back(item.key());
      throw ConfigError(fmt::format("tied key '{}' ties parameter '{}', which its module does not have (its "
                                    "parameters: [{}]); name one of those in tied_weight_attr",
                                    key, name, fmt::join(have, ", ")));
    }
    out.push_back(*p);
  }
  return out;
}

}  // namespace

schedule::Schedule train_schedule_for(const EngineConfig& config, int stages) {
  if (!config.pipeline.schedule_csv.empty()) {
    auto sched = read_train_schedule_csv(config, stages);
    if (config.pipeline.deferred_linear) sched = schedule::defer_weight_gradients(sched);
    return sched;
  }
  const auto kind = schedule::parse_kind(config.pipeline.schedule);
  if (!schedule::is_training(kind)) {
    throw ConfigError("pipeline.schedule \"" + config.pipeline.schedule +
                      "\" does not train; use 1f1b, fill-drain, interleaved, zb-h1, zb-v, dualpipev, v-half or v-min");
  }
  const int m = static_cast<int>(config.gradient_accumulation_steps);
  const int chunks = config.pipeline.chunks > 1 ? static_cast<int>(config.pipeline.chunks) : 0;
  auto sched = schedule::generate(schedule::ScheduleOptions(kind, stages, m).chunks(chunks));
  if (config.pipeline.deferred_linear) sched = schedule::defer_weight_gradients(sched);
  return sched;
}

PipelineEngine::PipelineEngine(PipelineModule module, EngineConfig config,
                               std::shared_ptr<comm::Communicator> comm)
    : module_(std::move(module)),
      config_(std::move(config)),
      comm_(std::move(comm)),
      topology_(comm::Topology::for_world(
          comm_ ? comm_->world_size() : 1,
          resolve_stages(module_, config_, (comm_ ? comm_->world_size() : 1) / tensor_size(config_)), 0,
          tensor_size(config_))) {
  if (!comm_) throw UsageError("PipelineEngine needs a communicator (PipelineEngine::connect_from_env)");
  if (module_.layers.empty()) throw ModuleError("the PipelineModule has no layers");
  if (!module_.loss) throw ModuleError("the PipelineModule has no loss function");
  coord_ = topology_.coord_of(comm_->rank());
  config_.resolve_batch_sizes(topology_.replicas());
  // A config built in code skips the parser's check.
  config_.zero_optimization.check();
  // Where the process's default generator is now, as a process of its own would have it: ranks
  // that share a process (threads) draw as separate processes do.
  // Under the lock: another rank's thread may be building its layers in a SeededScope.
  {
    runtime::DefaultGeneratorLease lease;
    rng_stream_ = runtime::clone_generator(at::detail::getDefaultCPUGenerator());
  }

  device_ = runtime::resolve_device(config_.pipeline.device, comm_->local_rank());
  compute_dtype_ = runtime::compute_dtype(config_.precision());
  if (compute_dtype_ != c10::ScalarType::Float) {
    if (!runtime::low_precision_supported(device_, compute_dtype_)) {
      throw ConfigError(fmt::format(
          "precision {} does not compute on {} with this LibTorch ({}); use bf16 there (float16 on a "
          "CPU needs LibTorch 2.x), or fp32",
          config_.precision(), device_.str(), TORCH_VERSION));
    }
  }
  if (config_.fp16.enabled) scaler_.emplace(config_.fp16);

  train_schedule_ = train_schedule_for(config_, topology_.stages());
  const auto& layout = train_schedule_.layout;
  balance_ = partition_layers(module_.layers, config_.pipeline, layout.num_virtual_stages());
  offsets_ = part_offsets(balance_);
  auto skips = std::make_shared<const skip::SkipPlan>(skip_plan(module_.layers));
  skip_links_ = runtime::skip_links(*skips, offsets_);

  runtime::StageModelOptions options;
  options.deferred_linear = config_.pipeline.deferred_linear;
  options.gemm_kernel = runtime::parse_gemm_kernel(config_.pipeline.gemm_kernel);
  options.checkpoint_interval = config_.pipeline.activation_checkpoint_interval;
  if (!skips->empty()) options.skips = skips;
  // Which stages hold each tied key: the engine keeps their copies equal.
  std::map<std::string, std::set<int>> holders;
  for (int v = 0; v < layout.num_virtual_stages(); ++v) {
    for (int64_t i = offsets_[v]; i < offsets_[v + 1]; ++i) {
      const auto& key = module_.layers[static_cast<size_t>(i)].tied_key;
      if (!key.empty()) holders[key].insert(layout.placement(v).stage);
    }
  }
  std::vector<comm::TiedKey> tied_keys;
  for (const auto& [key, stages] : holders) tied_keys.push_back({key, {stages.begin(), stages.end()}});
  groups_ = comm::build_pipe_groups(*comm_, topology_, tied_keys);
  // Tensor-parallel layers keep the group they are built under (runtime/parallel_layers.h).
  tp_.group = groups_.tensor_parallel;
  tp_.rank = coord_.tensor;
  tp_.size = topology_.tensor();
  if (tp_.active()) tp_.sharded_rng = runtime::make_sharded_generator(config_.seed, coord_.tensor);
  runtime::TensorParallelScope tp_scope(tp_);
  std::map<std::string, torch::nn::AnyModule> local_tied;
  for (int c = 0; c < layout.num_chunks(); ++c) {
    const int v = layout.virtual_stage(stage(), c);
    auto built = build_seeded_layers(module_.layers, offsets_[v], offsets_[v + 1], config_.seed);
    // Built on the CPU under the seed (the same weights whatever the device), then moved.
    if (!device_.is_cpu()) {
      for (auto& m : built.modules) m.ptr()->to(device_);
    }
    // A stage holding one tied key in two chunks (ZB-V's first and last part) uses one module.
    for (size_t i = 0; i < built.specs.size(); ++i) {
      const auto& key = built.specs[i].tied_key;
      if (key.empty()) continue;
      auto it = local_tied.find(key);
      if (it == local_tied.end()) {
        local_tied.emplace(key, built.modules[i]);
      } else {
        built.modules[i] = it->second;
      }
    }
    chunks_.push_back(std::make_unique<runtime::StageModel>(std::move(built), options));
  }

  for (const auto& [key, stages] : holders) {
    auto it = local_tied.find(key);
    if (it == local_tied.end()) continue;
    Tied t;
    t.key = key;
    t.params = tied_parameters(module_.layers, key, *it->second.ptr());
    t.counts_in_norm = *stages.begin() == stage();
    tied_.push_back(std::move(t));
  }

  sync_initial_weights();
  auto params = trainable_parameters();
  if (config_.optimizer.external && config_.zero_optimization.stage == 1 && num_replicas() > 1) {
    throw ConfigError("zero_optimization.stage 1 shards the engine's own optimizer, and a client optimizer "
                      "(initialize(optimizer=...), model_parameters or lr_scheduler) steps every parameter "
                      "itself: give the optimizer in the config's optimizer block, or use stage 0");
  }
  if (config_.zero_optimization.stage == 1 && num_replicas() > 1) {
    std::vector<int64_t> sizes;
    for (const auto& p : params) {
      const auto layout = runtime::shard_layout(p);
      sizes.push_back(layout ? p.numel() / p.size(layout->dim) * layout->full_size : p.numel());
    }
    zero_ = ZeroPartition(sizes, num_replicas(), replica());
    params = zero_.owned(params);
  }
  // An external (Python client) optimizer steps after train_batch, over the gradients left here.
  if (!params.empty() && !config_.optimizer.external) optimizer_ = make_optimizer(config_.optimizer, params);
  base_lr_ = config_.optimizer.lr;
}

PipelineEngine::~PipelineEngine() = default;

void PipelineEngine::set_gradient_accumulation_steps(int64_t steps) {
  if (steps < 1) throw ConfigError(fmt::format("gradient_accumulation_steps must be >= 1, got {}", steps));
  EngineConfig next = config_;
  next.gradient_accumulation_steps = steps;
  next.train_batch_size = steps * next.train_micro_batch_size_per_gpu * num_replicas();
  auto sched = train_schedule_for(next, num_stages());
  const auto& now = train_schedule_.layout;
  bool same_layout = sched.layout.num_chunks() == now.num_chunks();
  for (int s = 0; same_layout && s < num_stages(); ++s) {
    for (int c = 0; same_layout && c < now.num_chunks(); ++c) {
      same_layout = sched.layout.virtual_stage(s, c) == now.virtual_stage(s, c);
    }
  }
  if (!same_layout) {
    throw ConfigError(fmt::format("{} micro-batches per step would place the layers otherwise under schedule {}; "
                                  "keep {} or build a new engine",
                                  steps, config_.pipeline.schedule, config_.gradient_accumulation_steps));
  }
  config_ = std::move(next);
  train_schedule_ = std::move(sched);
}

std::shared_ptr<comm::Communicator> PipelineEngine::connect_from_env(const EngineConfig& config) {
  const auto info = comm::rank_info_from_env();
  comm::configure_threads(0, info.local_world_size);
  util::set_log_rank(info.rank);
  // Before connecting, so that every thread of the rank (Gloo's, the channel's) shares its
  // cores: measured on "mlp", a rank's helpers woken on the other rank's core cost as much as
  // no binding at all (docs/comm.md).
  const auto cpus = comm::plan_core_binding(config.pipeline.bind_cores, comm::process_cpus(), info.local_rank,
                                            info.local_world_size, at::get_num_threads());
  comm::bind_this_thread(cpus);
  if (!cpus.empty() && info.local_rank == 0) {
    util::log_info(fmt::format("{} local ranks bound to {} CPU(s) each (pipeline.bind_cores = {}; off leaves "
                               "placement to the scheduler)",
                               info.local_world_size, cpus.size(), config.pipeline.bind_cores));
  }
  comm::CommOptions options;
  options.timeout(std::chrono::milliseconds(static_cast<int64_t>(config.pipeline.comm_timeout_s * 1000)));
  // Received activations land on the stage's device; collectives of CUDA tensors run over NCCL
  // where this LibTorch has it (Gloo moves host memory).
  const torch::Device device =
      runtime::resolve_device(config.pipeline.device, info.local_rank, -1, info.local_world_size);
  // The process's kernels and its CUDA context go to its own device, not to cuda:0 (each
  // worker thread still sets it for itself: the current device is per thread).
  if (!device.is_cpu()) c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
  options.device(device);
  const int64_t gpus = device.is_cuda() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  options.backend(comm::collective_backend(device.is_cuda(), info.local_world_size, gpus));
  if (device.is_cuda() && options.backend() == comm::Backend::Gloo) {
    util::log_info(comm::nccl_available()
                       ? fmt::format("collectives over Gloo: {} ranks on this host share {} GPU(s) and NCCL "
                                     "needs a GPU per rank",
                                     info.local_world_size, gpus)
                       : std::string("collectives over Gloo: this LibTorch has no NCCL"));
  }
  return std::shared_ptr<comm::Communicator>(comm::connect(info, options));
}

void PipelineEngine::forward() {
  throw UsageError("PipelineEngine::forward is not supported: one step of a pipeline is one "
                   "train_batch(data) call (or eval_batch(data) for evaluation)");
}
void PipelineEngine::backward() {
  throw UsageError("PipelineEngine::backward is not supported: train_batch(data) runs forward, "
                   "backward and the optimizer step together over the pipeline schedule");
}
void PipelineEngine::step() {
  throw UsageError("PipelineEngine::step is not supported: train_batch(data) takes the optimizer "
                   "step at the end of the schedule");
}

std::vector<torch::Tensor> PipelineEngine::parameters() const {
  std::vector<torch::Tensor> out;
  std::set<const void*> seen;
  for (const auto& chunk : chunks_) {
    for (const auto& p : chunk->parameters()) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    }
  }
  return out;
}

std::vector<torch::Tensor> PipelineEngine::trainable_parameters() const {
  auto params = parameters();
  params.erase(std::remove_if(params.begin(), params.end(), [](const torch::Tensor& p) { return !p.requires_grad(); }),
               params.end());
  return params;
}

std::vector<std::pair<std::string, torch::Tensor>> PipelineEngine::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [index, module] : local_layers()) {
    for (const auto& item : module.ptr()->named_parameters(true)) {
      out.emplace_back(std::to_string(index) + "." + item.key(), item.value());
    }
  }
  return out;
}

std::vector<std::pair<int64_t, torch::nn::AnyModule>> PipelineEngine::local_layers() const {
  std::vector<std::pair<int64_t, torch::nn::AnyModule>> out;
  std::set<const void*> seen;
  const auto& layout = train_schedule_.layout;
  for (int c = 0; c < num_chunks(); ++c) {
    const int v = layout.virtual_stage(stage(), c);
    const auto& built = chunks_[static_cast<size_t>(c)]->layers();
    for (size_t i = 0; i < built.modules.size(); ++i) {
      if (!seen.insert(built.modules[i].ptr().get()).second) continue;
      out.emplace_back(offsets_[v] + static_cast<int64_t>(i), built.modules[i]);
    }
  }
  return out;
}

void PipelineEngine::parameters_changed() {
  for (auto& chunk : chunks_) chunk->weights_changed();
}

bool PipelineEngine::loads_data() const {
  const auto& layout = train_schedule_.layout;
  for (int c = 0; c < num_chunks(); ++c) {
    if (layout.is_first(stage(), c) || layout.is_last(stage(), c)) return true;
  }
  return false;
}

std::vector<MicroBatch> PipelineEngine::pull(DataIterator& data, const char* what, int m) {
  std::vector<MicroBatch> out;
  if (!loads_data()) return out;
  // In a tensor-parallel group only the first rank reads; the others get its micro-batches.
  const bool reads = tensor_rank() == 0;
  std::string error;
  for (int i = 0; reads && i < m; ++i) {
    auto mb = data.next();
    if (!mb) {
      error = fmt::format(
          "{}: the data iterator ran out after {} of the {} micro-batches of step {} "
          "(gradient_accumulation_steps = {}); give it {} micro-batches per call, or stop "
          "calling when it is exhausted",
          what, i, m, global_steps_ + 1, m, m);
      break;
    }
    out.push_back(std::move(*mb));
  }
  return detail::broadcast_micro_batches(*groups_.tensor_parallel, groups_.tensor_parallel->ranks().front(), reads,
                                         std::move(out), error);
}

runtime::StageStep PipelineEngine::make_step(const schedule::Schedule& sched,
                                             const std::vector<MicroBatch>& data, bool training) {
  runtime::StageStep s;
  s.schedule = &sched;
  s.stage = stage();
  for (auto& c : chunks_) s.chunks.push_back(c.get());
  s.channel = &comm_->channel();
  s.rank_of_stage = [this](int st) { return topology_.rank_of(st, replica(), tensor_rank()); };
  s.tensor_parallel = tp_;
  s.loss = module_.loss;
  s.data = &data;
  s.training = training;
  s.clock = wall_seconds;
  s.rng_stream = rng_stream_;
  s.device = device_;
  s.skip_links = &skip_links_;
  return s;
}

double PipelineEngine::train_batch(DataIterator& data) {
  const double t0 = wall_seconds();
  for (auto& c : chunks_) c->train(true);
  runtime::StageStepResult result;
  last_ = StepStats();
  try {
    const auto micro = pull(data, "train_batch", micro_batches());
    clear_grads();
    auto step = make_step(train_schedule_, micro, true);
    step.on_step_op = [this](schedule::Op op, const runtime::StageStepResult& so_far) { on_step_op(op, so_far); };
    step.loss_scale = loss_scale();
    last_.loss_scale = step.loss_scale;
    runtime::AutocastScope autocast(device_, compute_dtype_);
    runtime::TensorParallelScope tp_scope(tp_);  // the loss function may be vocabulary-parallel
    result = runtime::run_stage_step(step);
  } catch (const NumericError&) {
    throw;  // every rank raises it together, after the same collective
  } catch (const std::exception& e) {
    comm_->report_failure(e.what());
    throw;
  }
  last_events_ = std::move(result.events);
  const double seconds = wall_seconds() - t0;
  last_.seconds = seconds;
  last_.samples_per_s = static_cast<double>(config_.train_batch_size) / seconds;
  last_.op_seconds = result.seconds;
  last_.weight_pauses = result.weight_pauses;
  last_.bytes_sent = result.bytes_sent;
  if (comm_->rank() == 0 && config_.steps_per_print > 0 && global_steps_ % config_.steps_per_print == 0) {
    util::log_info(fmt::format("step {} | loss {:.6f} | {:.3f} s/step | {:.1f} samples/s | lr {:.3g}{}",
                               global_steps_, last_.loss, seconds, last_.samples_per_s, last_.lr,
                               last_.skipped ? " | skipped (non-finite)" : ""));
  }
  if (config_.wall_clock_breakdown && config_.steps_per_print > 0 &&
      global_steps_ % config_.steps_per_print == 0) {
    std::string line = fmt::format("step {} time per action (ms):", global_steps_);
    for (int op = 0; op < schedule::kNumOps; ++op) {
      const double s = result.seconds[static_cast<size_t>(op)];
      if (s > 0) line += fmt::format(" {} {:.2f}", schedule::op_name(static_cast<schedule::Op>(op)), s * 1e3);
    }
    util::log_info(line);
  }
  return last_.loss;
}

EvalResult PipelineEngine::eval_batch(DataIterator& data, bool return_outputs, int micro_batches) {
  const int m = micro_batches > 0 ? micro_batches : this->micro_batches();
  auto found = eval_schedules_.find(m);
  if (found == eval_schedules_.end()) {
    const auto& layout = train_schedule_.layout;
    found = eval_schedules_
                .emplace(m, schedule::generate(schedule::ScheduleOptions(schedule::ScheduleKind::inference,
                                                                         topology_.stages(), m)
                                                   .chunks(layout.num_chunks())
                                                   .layout(layout.kind())))
                .first;
  }
  for (auto& c : chunks_) c->train(false);
  EvalResult out;
  runtime::StageStepResult result;
  std::vector<MicroBatch> micro;
  try {
    micro = pull(data, "eval_batch", m);
    auto step = make_step(found->second, micro, false);
    step.keep_outputs = return_outputs;
    torch::NoGradGuard no_grad;
    runtime::AutocastScope autocast(device_, compute_dtype_);
    runtime::TensorParallelScope tp_scope(tp_);  // the loss function may be vocabulary-parallel
    result = runtime::run_stage_step(step);
  } catch (const std::exception& e) {
    for (auto& c : chunks_) c->train(true);
    comm_->report_failure(e.what());
    throw;
  }
  for (auto& c : chunks_) c->train(true);
  // Every rank of a tensor-parallel group has the same loss: the first speaks for them.
  const double part = result.losses > 0 && tensor_rank() == 0
                          ? result.loss_sum / static_cast<double>(result.losses) / static_cast<double>(num_replicas())
                          : 0.0;
  out.loss = comm_->world().all_reduce_scalar(part, comm::ReduceOp::Sum, "eval loss");
  if (return_outputs) {
    for (auto& b : result.outputs) {
      if (!b.empty()) out.outputs.push_back(std::move(b));
    }
    if (!out.outputs.empty()) {
      for (auto& mb : micro) out.labels.push_back(std::move(mb.labels));
    }
  }
  return out;
}

}  // namespace pipetrain
