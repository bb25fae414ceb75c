// DeepSpeed configuration keys that pipetrain accepts without implementing them, per block:
// a DeepSpeed user's file parses, with one warning naming them, instead of failing on the
// first one. Taken from DeepSpeed's runtime/config.py, runtime/constants.py,
// runtime/precision_config.py, runtime/zero/config.py and monitor/config.py (field names and
// their aliases); keys nobody knows stay an error.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::config_detail::deepspeed {

inline const std::vector<std::string> kTopLevel{
    "activation_checkpointing", "aio", "amp", "autotuning", "checkpoint", "comms_logger",
    "communication_data_type", "compile", "compression_training", "curriculum_learning",
    "data_efficiency", "data_types", "dataloader_drop_last", "datastates_ckpt", "disable_allgather",
    "dump_state", "eigenvalue", "elasticity", "expert_parallel", "flops_profiler", "fp32_allreduce",
    "gradient_allreduce_op", "gradient_predivide_factor", "graph_harvesting", "hybrid_engine",
    "log_level", "managed_gradient_accumulation", "memory_breakdown", "nebula", "prescale_gradients",
    "progressive_layer_drop", "quantize_training", "seq_parallel_communication_data_type",
    "sparse_attention", "sparse_gradients", "timers", "torch_autocast",
    "use_data_before_expert_parallelism", "vocabulary_size", "weight_quantization",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"};

inline const std::vector<std::string> kFp16{"auto_cast", "consecutive_hysteresis",
                                            "fp16_master_weights_and_grads"};

inline const std::vector<std::string> kBf16{"immediate_grad_update", "check_grad_overflow",
                                            "bf16_master_weights_and_grads", "bf16_optimizer_states"};

// Everything but "stage": buckets, overlap, offload and the stage-3 knobs mean nothing at stage 0.
inline const std::vector<std::string> kZeroOptimization{
    "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "contiguous_gradients",
    "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint",
    "enable_sanity_checks", "gather_16bit_weights_on_model_save", "ignore_unused_parameters",
    "leaf_module", "legacy_stage1", "load_from_fp32_weights", "log_trace_cache_warnings",
    "max_live_parameters", "max_reuse_distance", "memory_efficient_linear",
    "mics_hierarchical_params_gather", "mics_shard_size", "model_persistence_threshold",
    "module_granularity_threshold", "offload_optimizer", "offload_param", "override_module_apply",
    "overlap_comm", "param_persistence_threshold", "pipeline_loading_checkpoint",
    "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter", "round_robin_gradients",
    "save_muon_momentum_buffer_in_memory", "stage3_allgather_sequential",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
    "stage3_module_granularity_threshold", "stage3_param_persistence_threshold",
    "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params", "sub_group_size",
    "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size",
    "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "zero_quantized_weights",
    "zeropp_loco_param"};

// HF Trainer fills these in; "auto" here means what leaving them out means.
inline const std::vector<std::string> kZeroOptimizationAuto{
    "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "sub_group_size"};

inline const std::vector<std::string> kOptimizer{"legacy_fusion"};

// DeepSpeed's own optimizer switches and torch.optim arguments pipetrain's optimizers lack.
inline const std::vector<std::string> kOptimizerParams{
    "amsgrad", "bias_correction", "capturable", "centered", "comm_backend_name",
    "cuda_aware", "dampening", "differentiable", "factor_max", "factor_min", "factor_threshold",
    "foreach", "freeze_step", "fused", "initial_accumulator_value", "lr_decay", "max_coeff",
    "max_grad_norm", "maximize", "min_coeff", "set_grad_none", "torch_adam"};

inline const std::vector<std::string> kSchedulerParams{"last_batch_iteration"};

// DeepSpeed's own pipeline keys (its "stages" and "activation_checkpoint_interval" are ours too).
inline const std::vector<std::string> kPipeline{"partition", "seed_layers", "pipe_partitioned",
                                                "grad_partitioned", "use_reentrant"};

// Monitors pipetrain does not write: accepted, and a warning when enabled.
inline const std::vector<std::string> kWandb{"group", "team", "project"};
inline const std::vector<std::string> kCsvMonitor{"output_path", "job_name"};
inline const std::vector<std::string> kComet{"samples_log_interval", "project", "workspace", "api_key",
                                             "experiment_name", "experiment_key", "online", "mode"};

}  // namespace pipetrain::config_detail::deepspeed
