// The engine's JSON configuration, with DeepSpeed's key names where they exist.
//
//   {
//     "train_batch_size": 256,                 // = micro batch x accumulation steps x replicas
//     "train_micro_batch_size_per_gpu": 32,
//     "gradient_accumulation_steps": 8,        // micro-batches per step and replica
//     "steps_per_print": 10,
//     "wall_clock_breakdown": false,
//     "gradient_clipping": 1.0,                // global norm across the whole pipeline; 0 = off
//     "seed": 1234,
//     "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999],
//                                               "eps": 1e-8, "weight_decay": 0.01}},
//     "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
//                                                  "warmup_num_steps": 100}},
//     "pipeline": {"stages": 2, "activation_checkpoint_interval": 0, "schedule": "1f1b", "chunks": 1,
//                  "partition_method": "parameters", "comm_timeout_s": 30,
//                  "on_nonfinite_loss": "error", "deferred_linear": true, "gemm_kernel": "auto"},
//     "bf16": {"enabled": false},
//     "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
//              "hysteresis": 2, "min_loss_scale": 1},
//     "zero_optimization": {"stage": 1},       // 0 or 1 (ZeroConfig::check)
//     "tensor_parallel": {"autotp_size": 2},   // ranks per tensor-parallel group
//     "tensorboard": {"enabled": true, "output_path": "runs/tb", "job_name": "gpt"}
//   }
//
// Unknown keys are an error naming them, so a typo never silently falls back to a default.
// DeepSpeed's own keys that pipetrain does not implement (prescale_gradients, amp, ZeRO's
// buckets, fp16.auto_cast, ...) are accepted and named in one warning; "wandb", "csv_monitor"
// and "comet" are accepted and warned about when enabled; "auto" (as the HF Trainer writes it)
// means the key's default where DeepSpeed allows it (batch sizes, gradient_clipping, optimizer
// and scheduler params, fp16/bf16.enabled, ZeRO's buckets).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

struct OptimizerConfig {
  std::string type = "SGD";  // SGD, Adam, AdamW, RMSprop, Adagrad
  double lr = 0.01;
  double momentum = 0.0;     // SGD, RMSprop
  bool nesterov = false;     // SGD
  double weight_decay = 0.0;
  std::array<double, 2> betas{0.9, 0.999};  // Adam, AdamW
  double eps = 1e-8;
  double alpha = 0.99;  // RMSprop
  // Set by the Python front end (never read from JSON): a client torch optimizer steps the
  // parameters after each train_batch, so the engine builds none of its own.
  bool external = false;
};

struct SchedulerConfig {
  std::string type;  // "" (constant), "WarmupLR", "WarmupDecayLR" (DeepSpeed's names)
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  int64_t total_num_steps = 0;  // WarmupDecayLR: linear decay to warmup_min_lr at this step
  // DeepSpeed's: "log" (its default, lr rises as log(step + 1) / log(warmup_num_steps)) or
  // "linear"; warm-ups shorter than 2 steps count as 2, as there.
  std::string warmup_type = "log";
  // The learning rate for a step (0-based) under this schedule; `base_lr` when type is "".
  double lr_at(int64_t step, double base_lr) const;
};

struct PipelineConfig {
  int64_t stages = 0;  // pipeline stages; 0 = the caller decides (PipelineModule::num_stages)
  int64_t activation_checkpoint_interval = 0;  // checkpoint every N layers inside a stage; 0 = off
  std::string schedule = "1f1b";               // a schedule kind (see `pipetrain schedule --help`)
  int64_t chunks = 1;                          // model chunks per stage (interleaved, zb-v)
  // A schedule written by torch.distributed.pipelining (`_dump_csv`; schedule/torch_csv.h):
  // when set, the engine runs it instead of generating `schedule`; its rows must match the
  // stages and its micro-batches gradient_accumulation_steps.
  std::string schedule_csv;
  std::string partition_method = "parameters";  // parameters | uniform | type:REGEX | balance
  std::vector<int64_t> balance;                 // partition_method "balance": layers per stage
  double comm_timeout_s = 30.0;                 // every blocking wait between ranks
  std::string on_nonfinite_loss = "error";      // error | skip (skip the step with a warning)
  // Linear layers run the fused, deferred weight-gradient path (runtime/deferred_linear.h).
  bool deferred_linear = true;
  std::string gemm_kernel = "auto";  // auto | blas | onednn: the GEMM of that path
  // Where this rank's layers run: auto (cuda:LOCAL_RANK where CUDA is available, else cpu),
  // cpu, cuda or cuda:N (runtime::resolve_device).
  std::string device = "auto";
  // Bind each rank's threads to cores of its own (comm/threads.h): auto (when the local ranks'
  // threads fill the CPUs), on (whenever they fit; an error when not) or off. Multi-process
  // runs (connect_from_env).
  std::string bind_cores = "auto";
};

// DeepSpeed's "fp16" block: compute in float16 with fp32 master weights and loss scaling.
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;            // 0 = dynamic; > 0 = this fixed scale
  int64_t initial_scale_power = 16;   // dynamic: the first scale is 2^this
  int64_t loss_scale_window = 1000;   // steps without overflow before the scale doubles
  int64_t hysteresis = 2;             // overflows tolerated before the scale halves
  double min_loss_scale = 1.0;        // the scale never drops below this
};

// DeepSpeed's "bf16" block: compute in bfloat16 with fp32 master weights (no loss scaling).
struct Bf16Config {
  bool enabled = false;
};

// DeepSpeed's "zero_optimization" block: stage 0 (off) or 1 (optimizer state sharded across
// the data-parallel replicas, engine/zero_partition.h); see check().
struct ZeroConfig {
  int64_t stage = 0;
  // ConfigError (prefixed by `origin`) for a stage pipetrain cannot run: 2 and 3 (which, as in
  // DeepSpeed, do not combine with pipeline parallelism) and anything outside 0-3.
  void check(const std::string& origin = "config") const;
};

// DeepSpeed's "tensor_parallel" block ("autotp_size", or "tp_size" as its inference config
// names it): ranks per tensor-parallel group. Layers split themselves when built under a group
// (runtime/parallel_layers.h); the world is stages x replicas x size.
struct TensorParallelConfig {
  int64_t size = 1;
};

// DeepSpeed's "tensorboard" block: where `pipetrain train` writes TensorBoard event files.
struct TensorBoardConfig {
  bool enabled = false;
  std::string output_path;                    // "" = <run directory>/tensorboard
  std::string job_name = "DeepSpeedJobName";  // a directory inside output_path
};

// What a parse does with its warnings: both keep them in EngineConfig::warnings; Log also writes
// each one once to the log (util::log_warn). Collect is for callers that log them themselves
// (one rank of many). DeepSpeed is Collect, and unknown top-level keys are a warning naming
// them instead of an error, as DeepSpeed's engine ignores them (pipetrain.initialize).
enum class ConfigWarnings { Log, Collect, DeepSpeed };

struct EngineConfig {
  int64_t train_batch_size = 0;                // 0 = derive from the other two
  int64_t train_micro_batch_size_per_gpu = 0;  // 0 = derive
  int64_t gradient_accumulation_steps = 0;     // 0 = derive
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  double gradient_clipping = 0.0;
  uint64_t seed = 1234;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  PipelineConfig pipeline;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  TensorParallelConfig tensor_parallel;
  TensorBoardConfig tensorboard;
  // Filled by the parser: DeepSpeed keys it ignored, monitors it does not write. Not written
  // by to_json_text.
  std::vector<std::string> warnings;

  // "fp32", "bf16" or "fp16", from the two blocks (both enabled is a ConfigError at parse).
  std::string precision() const;
  // Enables the block of `precision` ("fp32" disables both); ConfigError for another name.
  void set_precision(const std::string& precision);

  // Fills in the batch-size triple for `replicas` data-parallel replicas with DeepSpeed's
  // rules (any two determine the third; one alone means no accumulation) and checks
  // train_batch_size == micro batch x accumulation steps x replicas. ConfigError otherwise.
  void resolve_batch_sizes(int64_t replicas);

  // Parses a JSON document; `origin` names it in errors (a file name).
  static EngineConfig from_json_text(const std::string& text, const std::string& origin = "config",
                                     ConfigWarnings warn = ConfigWarnings::Log);
  static EngineConfig from_file(const std::string& path, ConfigWarnings warn = ConfigWarnings::Log);
  std::string to_json_text() const;
};

}  // namespace pipetrain
