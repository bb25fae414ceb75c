// GPipe: construction (checks, conversions, split), forward, and the module interface.
#include "pipetrain/engine/gpipe.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <set>

#include "pipetrain/batch/microbatch.h"
#include "pipetrain/error.h"
#include "pipetrain/runtime/device.h"
#include "pipetrain/runtime/dropout.h"
#include "pipetrain/runtime/gemm.h"
#include "pipetrain/runtime/pipeline_backward.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/trace.h"
#include "pipetrain/skip/plan.h"

namespace pipetrain {
namespace {

std::vector<int64_t> micro_batch_keys(int64_t first, int64_t count) {
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < count; ++i) keys.push_back(first + i);
  return keys;
}

uint64_t draw_seed() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

}  // namespace

std::string to_string(Checkpoint mode) {
  switch (mode) {
    case Checkpoint::Always: return "always";
    case Checkpoint::ExceptLast: return "except_last";
    case Checkpoint::Never: return "never";
  }
  return "unknown";
}

GPipeOptions::GPipeOptions(std::vector<int64_t> balance) : balance_(std::move(balance)) {}

GPipeImpl::GPipeImpl(const torch::nn::Sequential& module, const GPipeOptions& options)
    : options_(options) {
  if (options_.chunks() <= 0) {
    throw ConfigError("the number of chunks must be a positive integer, got " +
                      std::to_string(options_.chunks()) +
                      "; use GPipeOptions::chunks(n) with n >= 1 micro-batches per mini-batch");
  }
  if (!(options_.task_timeout() > 0)) {
    throw ConfigError("task_timeout must be a positive number of seconds, got " +
                      std::to_string(options_.task_timeout()) +
                      "; use GPipeOptions::task_timeout(s) with the longest a micro-batch may take in one partition");
  }
  if (options_.intra_op_threads() < 0) {
    throw ConfigError("intra_op_threads must be >= 0 (0 keeps the default), got " +
                      std::to_string(options_.intra_op_threads()));
  }
  verify_module(module);
  torch::nn::Sequential model = module;
  if (options_.deferred_batch_norm()) model = runtime::convert_deferred_batch_norm(model);
  if (options_.convert_dropout()) model = runtime::convert_dropout(model);

  devices_ = options_.devices().empty()
                 ? runtime::default_devices(static_cast<int64_t>(options_.balance().size()))
                 : options_.devices();
  stages_ = split_module(model, options_.balance(), devices_);
  // Checked before the first forward, so a bad declaration never meets a half-run pipeline.
  const auto declarations = skip::declarations_of(model);
  if (std::any_of(declarations.begin(), declarations.end(), [](const auto& d) { return !d.empty(); })) {
    std::vector<std::string> names;
    for (const auto& layer : *model) {
      auto s = skip::as_skippable(layer.ptr());
      names.push_back(s ? s->layer_name() : layer.ptr()->name());
    }
    auto plan = std::make_shared<const skip::SkipPlan>(declarations, names);
    for (auto& stage : stages_) stage.skips = plan;
    for (const auto& route : plan->routes()) {
      for (const auto& stage : stages_) {
        const int64_t end = stage.first_layer + static_cast<int64_t>(stage.layers->size());
        if (route.stash_layer >= stage.first_layer && route.stash_layer < end) {
          stash_partitions_.emplace_back(route.key, stage.index);
        }
      }
    }
  }

  if (options_.deferred_linear()) {
    const runtime::GemmKernel kernel = runtime::parse_gemm_kernel(options_.gemm_kernel());
    for (auto& stage : stages_) {
      for (const auto& layer : *stage.layers) {
        auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(layer.ptr());
        stage.fast.push_back(linear ? std::make_shared<runtime::DeferredLinear>(torch::nn::Linear(linear), kernel)
                                    : nullptr);
      }
    }
  }

  auto partitions = torch::nn::ModuleList();
  for (const auto& stage : stages_) {
    partitions->push_back(stage.layers);
    for (const auto& layer : *stage.layers) layers_.push_back(layer.ptr());
  }
  register_module("partitions", partitions);
  if (!module->is_training()) eval();
  deferred_ = runtime::deferred_batch_norms(*this);
}

GPipeImpl::~GPipeImpl() = default;

torch::Tensor GPipeImpl::forward(const torch::Tensor& input) {
  return forward_batch(Batch(input)).tensor();
}

std::vector<torch::Tensor> GPipeImpl::forward(const std::vector<torch::Tensor>& input) {
  return forward_batch(Batch::tuple(input)).tensors();
}

Batch GPipeImpl::forward_batch(const Batch& input) {
  if (stages_.empty()) return input;  // an empty Sequential is the identity
  std::lock_guard<std::mutex> lock(forward_mutex_);
  std::vector<Batch> batches = scatter(input, options_.chunks());
  const auto m = static_cast<int64_t>(batches.size());
  int64_t checkpoint_stop = 0;
  if (is_training()) {
    switch (options_.checkpoint()) {
      case Checkpoint::Always: checkpoint_stop = m; break;
      case Checkpoint::ExceptLast: checkpoint_stop = m - 1; break;
      case Checkpoint::Never: checkpoint_stop = 0; break;
    }
  }
  if (!workers_ || workers_->abandoned()) {  // a task that hung keeps the old pool's thread
    workers_ = std::make_shared<runtime::WorkerPool>(num_partitions(), options_.intra_op_threads());
  }
  // Training: each task's graph is its own and the backward runs as a pipeline on the workers
  // (runtime/pipeline_backward.h); otherwise there is no backward to run.
  std::shared_ptr<runtime::StepGraph> graph;
  if (torch::GradMode::is_enabled() && needs_backward(input)) {
    graph = std::make_shared<runtime::StepGraph>(m, num_partitions());
  }
  const std::vector<Batch> inputs = batches;
  // The caller's optimizer may have changed the weights in place since the last step, which
  // the fast path's cached copies of them would not see.
  for (const auto& stage : stages_) {
    for (const auto& d : stage.fast) {
      if (d) d->weights_changed();
    }
  }
  const int64_t first_mb = next_mb_;
  next_mb_ += m;
  auto timeline = std::make_shared<runtime::StepTimeline>();
  last_timeline_ = timeline;
  try {
    runtime::run_pipeline(stages_, batches, checkpoint_stop, draw_seed(), *workers_, options_.task_timeout(),
                          graph.get(), first_mb, timeline);
  } catch (...) {
    for (auto& bn : deferred_) bn->discard();
    if (!workers_->abandoned()) {  // every task is done: what the step kept can go
      for (const auto& stage : stages_) {
        for (const auto& d : stage.fast) {
          if (d) d->discard(micro_batch_keys(first_mb, m));
        }
      }
    }
    throw;
  }
  for (auto& bn : deferred_) bn->commit();
  if (!graph) return gather(batches);
  runtime::BackwardPlan plan;
  plan.stages = stages_;
  plan.workers = workers_;
  plan.task_timeout_s = options_.task_timeout();
  plan.inputs = inputs;
  plan.caller_input = input;
  plan.stash_partition = stash_partitions_;
  plan.first_mb = first_mb;
  plan.timeline = timeline;
  return runtime::attach_pipelined_backward(std::move(graph), std::move(plan), batches);
}

bool GPipeImpl::needs_backward(const Batch& input) const {
  for (const auto& t : input.tensors()) {
    if (t.defined() && t.requires_grad()) return true;
  }
  for (const auto& p : parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

std::vector<schedule::TimedEvent> GPipeImpl::last_step_events() const {
  return last_timeline_ ? last_timeline_->events() : std::vector<schedule::TimedEvent>();
}

std::string GPipeImpl::chrome_trace() const {
  schedule::TraceOptions options;
  options.microseconds_per_unit = 1e6;  // seconds
  options.process_name = "GPipe";
  options.row_name = "partition";
  return schedule::render_chrome_trace(last_step_events(), options);
}

GPipeImpl::Bubble GPipeImpl::last_step_bubble() const {
  const auto events = last_step_events();
  if (events.empty()) {
    throw UsageError("GPipe::last_step_bubble: no step has run yet; call forward (and backward) first");
  }
  const auto n = static_cast<int>(num_partitions());
  Bubble bubble;
  bubble.measured = schedule::bubble_stats(events, n).overall;
  // The simulator's fill-drain has whole backwards: a partition's weight-gradient products
  // count as backward time of no micro-batch in particular.
  std::vector<schedule::TimedEvent> costed = events;
  std::set<int> micro_batches;
  bool backward = false;
  for (auto& e : costed) {
    if (e.op == schedule::Op::backward_weight) e.op = schedule::Op::backward;
    if (e.op == schedule::Op::forward) micro_batches.insert(e.micro_batch);
    backward = backward || e.op == schedule::Op::backward;
  }
  const auto kind = backward ? schedule::ScheduleKind::fill_drain : schedule::ScheduleKind::inference;
  const auto plan = schedule::generate(schedule::ScheduleOptions(kind, n, static_cast<int>(micro_batches.size())));
  bubble.simulated = schedule::simulate(plan, schedule::estimate_costs(costed, n, 1)).bubble_overall;
  return bubble;
}

std::shared_ptr<torch::nn::Module> GPipeImpl::operator[](int64_t index) const {
  const int64_t n = size();
  TORCH_CHECK_INDEX(index >= -n && index < n, "GPipe layer index ", index,
                    " is out of range for a model of ", n, " layers (valid: ", -n, " .. ", n - 1,
                    ")");
  return layers_[index < 0 ? index + n : index];
}

namespace {
[[noreturn]] void moving_denied(torch::Device device) {
  throw DeviceError("GPipe manages device placement (partition j lives on devices()[j]); moving "
                    "it to " + device.str() + " is refused. Choose devices with "
                    "GPipeOptions::devices when you build it; casting to a dtype is allowed");
}
}  // namespace

void GPipeImpl::to(torch::Device device, torch::Dtype, bool) { moving_denied(device); }
void GPipeImpl::to(torch::Device device, bool) { moving_denied(device); }
void GPipeImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
}

void GPipeImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::GPipe(balance=[";
  for (size_t j = 0; j < balance().size(); ++j) stream << (j ? ", " : "") << balance()[j];
  stream << "], chunks=" << chunks() << ", checkpoint=" << to_string(checkpoint()) << ")";
}

}  // namespace pipetrain
