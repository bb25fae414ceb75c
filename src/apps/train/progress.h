// What a person sees while `pipetrain train` runs: a progress bar on a terminal, plain log
// lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace pipetrain::apps {

class Progress {
 public:
  // `terminal`: redraw one line in place; otherwise print a line every `every` steps.
  Progress(std::ostream& out, int64_t first_step, int64_t total_steps, bool terminal, int64_t every);
  void update(int64_t step, double loss, double samples_per_s);
  void note(const std::string& line);  // a line that must not be overwritten (evaluation)
  void finish();

  // "1:05", "12:00:03"
  static std::string format_eta(double seconds);

 private:
  std::ostream& out_;
  int64_t first_;
  int64_t total_;
  bool terminal_;
  int64_t every_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace pipetrain::apps
