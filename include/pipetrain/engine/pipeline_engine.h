// PipelineEngine: one process (rank) per pipeline stage and data replica, training a
// PipelineModule with a schedule from the schedule layer (DeepSpeed's PipelineEngine).
//
//   auto comm = PipelineEngine::connect_from_env(config);   // torchrun / mpirun / srun / launch
//   PipelineEngine engine(std::move(module), config, comm);
//   for (int step = 0; step < steps; ++step) {
//     double loss = engine.train_batch(data);   // every rank gets the batch's mean loss
//   }
//
// Every rank runs the same calls in the same order. Only the ranks holding the first or the
// last layers pull micro-batches from their iterator (gradient_accumulation_steps per step).
#pragma once

#include <torch/torch.h>

#include <array>
#include <chrono>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/batch/data_iterator.h"
#include "pipetrain/comm/communicator.h"
#include "pipetrain/comm/topology.h"
#include "pipetrain/engine/config.h"
#include "pipetrain/engine/loss_scaler.h"
#include "pipetrain/engine/pipeline_module.h"
#include "pipetrain/engine/zero_partition.h"
#include "pipetrain/runtime/stage_executor.h"
#include "pipetrain/runtime/stage_model.h"
#include "pipetrain/runtime/tensor_parallel.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/timeline.h"

namespace pipetrain {

struct StepStats {
  int64_t step = 0;       // 1-based count of optimizer steps taken (or skipped)
  double loss = 0;        // mean over micro-batches and replicas
  double grad_norm = 0;   // global norm over the whole pipeline, before clipping
  double lr = 0;
  double seconds = 0;     // wall time of train_batch on this rank
  double samples_per_s = 0;
  bool skipped = false;   // non-finite loss or gradient with on_nonfinite_loss = "skip", or an
                          // fp16 overflow
  double loss_scale = 1;  // fp16: the scale this step's loss was multiplied by; else 1
  int64_t bytes_sent = 0; // activation and gradient bytes this rank sent to other stages
  // Seconds per schedule op on this rank (forward, backward_input, send_activation, ...).
  std::array<double, schedule::kNumOps> op_seconds{};
  // Weight-gradient groups this rank paused because a gradient arrived (stage_executor.cpp).
  int64_t weight_pauses = 0;
};

struct EvalResult {
  double loss = 0;             // mean over micro-batches and replicas, on every rank
  std::vector<Batch> outputs;  // on the last stage with return_outputs, by micro-batch
  std::vector<Batch> labels;   // their labels (also on ranks of a tensor-parallel group that read none)
};

struct BubbleReport {
  double measured = 0;   // idle fraction of the last step's compute on this replica's stages
  double simulated = 0;  // the simulator's for the same schedule, with the step's own costs
  double makespan_s = 0;
  double transfer_s = 0;  // the measured transfer latency the simulation used
};

// The schedule a train_batch of `config` runs on `stages` stages (its layout says which
// virtual stages each stage holds), as the engine makes it.
schedule::Schedule train_schedule_for(const EngineConfig& config, int stages);

class PipelineEngine {
 public:
  // `comm` connects this rank to the others (comm::connect, or an InProcessHub endpoint).
  // Builds this rank's layers, the groups and the optimizer; makes tied and data-parallel
  // copies equal. ConfigError for a world size that is not stages x replicas, BalanceError
  // for a partition that does not fit.
  PipelineEngine(PipelineModule module, EngineConfig config, std::shared_ptr<comm::Communicator> comm);
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  // Rendezvous from the launcher's environment (torchrun, mpirun, srun, pipetrain launch) with
  // the config's timeouts, after splitting the cores between the local ranks.
  static std::shared_ptr<comm::Communicator> connect_from_env(const EngineConfig& config);

  // One optimizer step over gradient_accumulation_steps micro-batches. Returns the batch's
  // mean loss on every rank. DataError when the iterator runs out within the batch.
  double train_batch(DataIterator& data);
  // Forward only, on the inference schedule, without touching gradients or the optimizer.
  // `micro_batches` (0: gradient_accumulation_steps) lets the last call of an evaluation
  // set take what is left; every rank must pass the same count.
  EvalResult eval_batch(DataIterator& data, bool return_outputs = false, int micro_batches = 0);

  // DeepSpeed's pipeline engine refuses these too: a step is one train_batch call.
  [[noreturn]] void forward();
  [[noreturn]] void backward();
  [[noreturn]] void step();

  int stage() const { return coord_.stage; }
  int replica() const { return coord_.replica; }
  // Index in this stage's tensor-parallel group, and the group's size (tensor_parallel.size).
  int tensor_rank() const { return coord_.tensor; }
  int tensor_parallel_size() const { return topology_.tensor(); }
  const runtime::TensorParallelGroup& tensor_parallel() const { return tp_; }
  int num_stages() const { return topology_.stages(); }
  int num_replicas() const { return topology_.replicas(); }
  bool is_first_stage() const { return stage() == 0; }
  bool is_last_stage() const { return stage() == num_stages() - 1; }
  int micro_batches() const { return static_cast<int>(config_.gradient_accumulation_steps); }
  int64_t global_steps() const { return global_steps_; }
  // After loading a checkpoint: the step count the LR schedule continues from.
  void set_global_steps(int64_t steps) { global_steps_ = steps; }
  // DeepSpeed's set_train_batch_size: later steps take `steps` micro-batches (train_batch_size
  // follows). Every rank calls it with the same count. ConfigError when the schedule cannot run
  // that count, or would place the layers otherwise.
  void set_gradient_accumulation_steps(int64_t steps);
  // The step the LR schedule counts from (0): a load that keeps the scheduler's state out
  // (DeepSpeed's load_lr_scheduler_states=False) restarts the schedule at the loaded step.
  void set_scheduler_start(int64_t step) { scheduler_start_ = step; }
  // The learning rate the next optimizer step uses.
  double next_lr() const { return config_.scheduler.lr_at(global_steps_ - scheduler_start_, base_lr_); }
  const PipelineModule& module() const { return module_; }
  // This rank's layers by global index, each module once (at its first local use).
  std::vector<std::pair<int64_t, torch::nn::AnyModule>> local_layers() const;
  const EngineConfig& config() const { return config_; }
  const comm::Topology& topology() const { return topology_; }
  comm::Communicator& communicator() { return *comm_; }
  // The schedule train_batch runs (after deferring weight gradients where that applies).
  const schedule::Schedule& train_schedule() const { return train_schedule_; }
  // Layers per virtual stage, and the global index of this stage's first layer per chunk.
  const std::vector<int64_t>& balance() const { return balance_; }

  // This rank's parameters, each shared module once.
  std::vector<torch::Tensor> parameters() const;
  // Those with requires_grad: the optimizer's, ZeRO's shards, the all-reduces' and the norm's.
  // Frozen parameters are never stepped, reduced or decayed, and keep no optimizer state.
  std::vector<torch::Tensor> trainable_parameters() const;
  // "<global layer index>.<parameter name>" -> tensor, for this rank's layers (a tied module
  // appears under its first local use).
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  runtime::StageModel& chunk(int local_chunk) { return *chunks_.at(static_cast<size_t>(local_chunk)); }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  // Over the parameters this rank updates: all of parameters(), or its ZeRO-1 shard.
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  // zero_optimization.stage 1 with replicas: which replica updates which parameter (of
  // parameters()); one replica otherwise.
  const ZeroPartition& zero_partition() const { return zero_; }
  // Bytes of this rank's optimizer state (momentum, Adam's moments), 0 before the first step.
  int64_t optimizer_state_bytes() const { return optimizer_ ? pipetrain::optimizer_state_bytes(*optimizer_) : 0; }
  // Call after changing parameters in place outside train_batch (loading a checkpoint).
  void parameters_changed();

  const StepStats& last_step() const { return last_; }
  // The last train_batch's actions on this rank (seconds on the host clock).
  const std::vector<schedule::TimedEvent>& last_events() const { return last_events_; }
  // The stream this rank's random ops draw from (lent as the default CPU generator during each
  // forward): a copy of the default generator when the engine was built, saved in checkpoints.
  at::Generator random_stream() const { return rng_stream_; }
  // Where this rank's layers and activations live (pipeline.device, resolved for LOCAL_RANK).
  torch::Device device() const { return device_; }
  // What the layers compute in (config bf16/fp16 blocks): Float, BFloat16 or Half. Parameters,
  // gradients and the optimizer state stay float32 whatever it is.
  c10::ScalarType compute_dtype() const { return compute_dtype_; }
  // fp16 only: the loss scaler (its state is saved in checkpoints); nullptr otherwise.
  LossScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }
  // The scale the next step's loss is multiplied by (1 unless fp16).
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  // Collective over this replica's pipeline: every stage's events of the last step, rows =
  // stages, times from the step's start.
  std::vector<schedule::TimedEvent> gather_events() { return gather_events(last_events_); }
  // The same for one step's events kept from last_events() (every stage passes its own events
  // of that same step), so a caller can time many steps and measure them all afterwards.
  std::vector<schedule::TimedEvent> gather_events(const std::vector<schedule::TimedEvent>& local);
  // Collective: measured vs simulated bubble of the last step, or of one kept step.
  BubbleReport measure_bubble() { return measure_bubble(last_events_); }
  BubbleReport measure_bubble(const std::vector<schedule::TimedEvent>& local);

 private:
  std::vector<MicroBatch> pull(DataIterator& data, const char* what, int count);
  bool loads_data() const;
  void on_step_op(schedule::Op op, const runtime::StageStepResult& so_far);
  void reduce_tied_grads();
  void reduce_data_parallel_grads();
  void optimizer_step(const runtime::StageStepResult& so_far);
  double local_grad_sqnorm() const;
  void clear_grads();
  void sync_initial_weights();
  runtime::StageStep make_step(const schedule::Schedule& schedule, const std::vector<MicroBatch>& data,
                               bool training);

  PipelineModule module_;
  EngineConfig config_;
  std::shared_ptr<comm::Communicator> comm_;
  comm::Topology topology_;
  comm::Coord coord_;
  comm::PipeGroups groups_;
  runtime::TensorParallelGroup tp_;
  std::vector<int64_t> balance_;
  std::vector<int64_t> offsets_;
  std::vector<runtime::SkipLink> skip_links_;  // skips between parts (runtime/skip_links.h)
  std::vector<std::unique_ptr<runtime::StageModel>> chunks_;
  // Tied keys this stage holds, with their module's parameters, and whether this stage is the
  // lowest holder (it alone counts them in the global norm).
  struct Tied {
    std::string key;
    std::vector<torch::Tensor> params;
    bool counts_in_norm = false;
  };
  std::vector<Tied> tied_;
  schedule::Schedule train_schedule_;
  std::map<int, schedule::Schedule> eval_schedules_;  // by micro-batch count
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  ZeroPartition zero_;
  double base_lr_ = 0;
  int64_t global_steps_ = 0;
  int64_t scheduler_start_ = 0;
  StepStats last_;
  double step_loss_ = 0;
  std::vector<schedule::TimedEvent> last_events_;
  std::vector<double> clock_offsets_;
  at::Generator rng_stream_;
  c10::ScalarType compute_dtype_ = c10::ScalarType::Float;
  std::optional<LossScaler> scaler_;
  torch::Device device_ = torch::kCPU;  // per pipeline-group member, on the first stage's clock
};

}  // namespace pipetrain
