// DeepSpeed's monitor for `pipetrain train`: TensorBoard scalars under DeepSpeed's names,
// written by rank 0.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "pipetrain/engine/config.h"
#include "pipetrain/util/tensorboard.h"

namespace pipetrain::apps {

// Where a run's event files go: <output_path>/<job_name> when tensorboard.enabled, with
// output_path "" meaning <run_dir>/tensorboard; <run_dir>/tensorboard otherwise.
std::filesystem::path tensorboard_dir(const TensorBoardConfig& config, const std::filesystem::path& run_dir);
// The same directory, created: ConfigError naming the tensorboard settings when it cannot be.
std::filesystem::path make_tensorboard_dir(const TensorBoardConfig& config, const std::filesystem::path& run_dir);

class TrainMonitor {
 public:
  explicit TrainMonitor(const std::filesystem::path& dir) : writer_(dir) {}

  // One optimizer step, at `samples` (samples trained so far: DeepSpeed's step for
  // Train/Samples/*): train_loss, lr, loss_scale, samples_per_sec.
  void step(int64_t samples, double loss, double lr, double loss_scale, double samples_per_sec);
  // An evaluation at `samples`: Eval/Samples/eval_loss and Eval/Samples/<metric>.
  void evaluation(int64_t samples, const std::string& metric, double value, double loss);

  const std::filesystem::path& path() const { return writer_.path(); }

 private:
  util::TensorBoardWriter writer_;
};

}  // namespace pipetrain::apps
