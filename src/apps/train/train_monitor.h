// DeepSpeed's monitor for `pipetrain train`: TensorBoard scalars under DeepSpeed's names,
// written by rank 0.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>

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

namespace monitor_detail {
template <typename Engine, typename = void>
struct has_loss_scale : std::false_type {};
template <typename Engine>
struct has_loss_scale<Engine, std::void_t<decltype(std::declval<Engine&>().loss_scale())>> : std::true_type {};
}  // namespace monitor_detail

// The loss scale to report: the engine's (PipelineEngine::loss_scale(), from its mixed
// precision, once the engine has that getter), else 1.0, what DeepSpeed reports without fp16.
// The one place that hooks the monitor up to the engine's loss scaling.
template <typename Engine>
double loss_scale_of(Engine& engine) {
  if constexpr (monitor_detail::has_loss_scale<Engine>::value) {
    return static_cast<double>(engine.loss_scale());
  } else {
    return 1.0;
  }
}

}  // namespace pipetrain::apps
