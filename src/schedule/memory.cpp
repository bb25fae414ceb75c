// The memory model: static bytes plus the activations of the micro-batches in flight.
#include "pipetrain/schedule/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "pipetrain/error.h"

namespace pipetrain::schedule {

double optimizer_state_factor(const std::string& optimizer, double momentum) {
  std::string name;
  for (char c : optimizer) name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name == "adam" || name == "adamw") return 2.0;
  if (name == "sgd") return momentum > 0 ? 1.0 : 0.0;
  if (name == "rmsprop" || name == "adagrad") return 1.0;
  throw ConfigError(fmt::format("optimizer '{}' has no memory model; use SGD, Adam, AdamW, RMSprop or Adagrad",
                                optimizer));
}

std::vector<double> peak_memory_bytes(const Schedule& s, const std::vector<StageMemory>& memory) {
  const int P = s.num_stages();
  if (static_cast<int>(memory.size()) != P)
    throw ConfigError(fmt::format("memory model: {} stage entries for a schedule of {} stages", memory.size(), P));
  for (int j = 0; j < P; ++j) {
    const StageMemory& m = memory[static_cast<size_t>(j)];
    for (double v : {m.static_bytes, m.activation_bytes, m.transient_bytes, m.weight_bytes})
      if (!std::isfinite(v) || v < 0)
        throw ConfigError(fmt::format("memory model: stage {} has {} bytes; sizes are finite and >= 0", j, v));
  }
  const double V = s.num_chunks();
  std::vector<double> peak(static_cast<size_t>(P), 0.0);
  for (int j = 0; j < P; ++j) {
    const auto& actions = s.stages[static_cast<size_t>(j)];
    const StageMemory& m = memory[static_cast<size_t>(j)];
    // Where each (chunk, micro-batch)'s graph is freed (its B or I) and where its kept inputs
    // are last needed (its last backward action).
    std::map<std::pair<int, int>, size_t> freed, last;
    for (size_t k = 0; k < actions.size(); ++k) {
      const Action& a = actions[k];
      if (a.op == Op::backward || a.op == Op::backward_input) freed[{a.chunk, a.micro_batch}] = k;
      if (a.op == Op::backward || a.op == Op::backward_input || a.op == Op::backward_weight)
        last[{a.chunk, a.micro_batch}] = k;
    }
    double live = 0, held = 0, most = 0;
    for (size_t k = 0; k < actions.size(); ++k) {
      const Action& a = actions[k];
      if (a.op == Op::forward && s.training) {
        live += 1;
        held += 1;
      }
      double now = (live * m.activation_bytes + held * m.weight_bytes) / V;
      // An inference forward holds its micro-batch only while it runs.
      if (a.op == Op::forward && !s.training) now += (m.activation_bytes + m.weight_bytes) / V;
      // The recompute happens in the backward that needs the activations (B, or the full
      // backward), not in a deferred W, which only reads kept inputs.
      if (a.op == Op::backward || a.op == Op::backward_input) now += m.transient_bytes / V;
      most = std::max(most, now);
      const std::pair<int, int> key{a.chunk, a.micro_batch};
      const bool backward = a.op == Op::backward || a.op == Op::backward_input || a.op == Op::backward_weight;
      if (backward && freed.count(key) && freed.at(key) == k) live -= 1;
      if (backward && last.at(key) == k) held -= 1;
    }
    peak[static_cast<size_t>(j)] = m.static_bytes + most;
  }
  return peak;
}

}  // namespace pipetrain::schedule
