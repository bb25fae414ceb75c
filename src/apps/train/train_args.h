// The options of `pipetrain train`, shared by the launching process and its ranks.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain::apps {

struct TrainArgs {
  std::string example = "cnn";
  int stages = 0;  // 0: the example's default (2)
  int replicas = 1;
  int micro_batches = 0;     // 0: the example's
  int micro_batch_size = 0;  // 0: the example's
  std::string schedule;      // "": the config's (1f1b)
  std::string precision;     // "": the config's bf16/fp16 blocks (fp32 without them)
  int zero_stage = -1;       // -1: the config's zero_optimization.stage
  int tensor_parallel = 0;   // 0: the config's tensor_parallel size (1 without it)
  int64_t steps = 0;         // 0: --epochs or the example's default
  double epochs = 0;
  std::string config_file;
  std::string plan;  // a plan file (pipetrain plan): layout, balance, checkpointing
  std::vector<int64_t> balance;  // layers per stage; empty: chosen from measured costs (default_split.h)
  std::string run_dir;
  bool resume = false;
  int64_t checkpoint_every = 0;  // also save every N steps (0: at the end only)
  int max_restarts = 0;          // restart the ranks after a failure, resuming from the checkpoint
  bool oversubscribe = false;    // start more than comm::kMaxRanksPerCore processes per core
  int64_t eval_every = 0;
  int64_t eval_samples = 0;  // 0: the whole evaluation set
  double dropout = 0;        // GPT-2's dropout (gpt)
  int64_t log_every = 0;     // 0: about 20 lines per run
  int threads_per_rank = 0;
  double time_limit = 0;
  int sample_length = 300;
  // Internal: this process is one rank.
  bool worker = false;

  // The arguments a rank gets (with --worker and the resolved run directory).
  std::vector<std::string> worker_arguments() const;
};

// The plan file's layout on the arguments (example, stages, replicas, micro-batches and their
// size, schedule); its chunks, balance and checkpointing go on the config (make_train_config).
// Does nothing without --plan; ConfigError for a plan of another example than --example.
void apply_plan_file(TrainArgs& args, bool example_given);

void add_train_options(CLI::App& sub, const std::shared_ptr<TrainArgs>& args);

}  // namespace pipetrain::apps
