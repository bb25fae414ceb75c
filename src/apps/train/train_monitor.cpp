// DeepSpeed's monitor for `pipetrain train`: TensorBoard scalars under DeepSpeed's names.
#include "apps/train/train_monitor.h"

#include <system_error>

#include "pipetrain/error.h"

namespace pipetrain::apps {

namespace fs = std::filesystem;

fs::path tensorboard_dir(const TensorBoardConfig& config, const fs::path& run_dir) {
  const fs::path own = run_dir / "tensorboard";
  if (!config.enabled) return own;
  return (config.output_path.empty() ? own : fs::absolute(config.output_path)) / config.job_name;
}

fs::path make_tensorboard_dir(const TensorBoardConfig& config, const fs::path& run_dir) {
  const auto dir = tensorboard_dir(config, run_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw ConfigError("cannot create the TensorBoard directory " + dir.string() + " (" + ec.message() + ")" +
                      (config.enabled ? "; set \"tensorboard.output_path\" to a writable directory"
                                      : "; give a writable --run-dir"));
  }
  return dir;
}

void TrainMonitor::step(int64_t samples, double loss, double lr, double loss_scale, double samples_per_sec) {
  writer_.add_scalar("Train/Samples/train_loss", loss, samples);
  writer_.add_scalar("Train/Samples/lr", lr, samples);
  writer_.add_scalar("Train/Samples/loss_scale", loss_scale, samples);
  writer_.add_scalar("Train/Samples/samples_per_sec", samples_per_sec, samples);
  writer_.flush();  // TensorBoard shows the run as it goes, and a crash keeps what was written
}

void TrainMonitor::evaluation(int64_t samples, const std::string& metric, double value, double loss) {
  writer_.add_scalar("Eval/Samples/eval_loss", loss, samples);
  writer_.add_scalar("Eval/Samples/" + metric, value, samples);
  writer_.flush();
}

}  // namespace pipetrain::apps
