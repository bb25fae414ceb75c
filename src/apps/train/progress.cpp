// The progress bar of `pipetrain train`.
#include "apps/train/progress.h"

#include <fmt/format.h>

#include <cmath>
#include <ostream>

namespace pipetrain::apps {

Progress::Progress(std::ostream& out, int64_t first_step, int64_t total_steps, bool terminal, int64_t every)
    : out_(out), first_(first_step), total_(total_steps), terminal_(terminal), every_(std::max<int64_t>(1, every)) {}

std::string Progress::format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

void Progress::update(int64_t step, double loss, double samples_per_s) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - first_;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step) : NAN;
  if (terminal_) {
    constexpr int kWidth = 28;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : 0;
    out_ << fmt::format("\r[{}{}] {}/{} loss {:.4f} {:.0f} samples/s ETA {}   ", std::string(filled, '#'),
                        std::string(kWidth - filled, '.'), step, total_, loss, samples_per_s, format_eta(eta))
         << std::flush;
    drawn_ = true;
  } else if (step % every_ == 0 || step == total_ || done == 1) {
    out_ << fmt::format("step {}/{} loss {:.4f} {:.0f} samples/s ETA {}", step, total_, loss, samples_per_s,
                        format_eta(eta))
         << std::endl;
  }
}

void Progress::note(const std::string& line) {
  if (terminal_ && drawn_) out_ << "\n";
  drawn_ = false;
  out_ << line << std::endl;
}

void Progress::finish() {
  if (terminal_ && drawn_) out_ << std::endl;
  drawn_ = false;
}

}  // namespace pipetrain::apps
