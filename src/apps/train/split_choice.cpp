// The default split of `pipetrain train`: the planner's prediction of each candidate micro-batch
// count (its min-max balance over the measured costs, simulated), the fastest within the bubble
// target.
#include "apps/train/split_choice.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "pipetrain/error.h"
#include "pipetrain/schedule/generate.h"

namespace pipetrain::apps {

std::string format_balance(const std::vector<int64_t>& balance) { return fmt::format("{}", fmt::join(balance, "|")); }

namespace split_choice_detail {

// Each stage's forward and backward over a step: the sum of its parts' layers, times M.
std::vector<double> stage_seconds(const SplitRequest& r, const schedule::Plan& p) {
  const auto& c = r.search.costs.at(p.micro_batches);
  const auto layout = schedule::generate(schedule::ScheduleOptions(r.kind, r.stages, p.micro_batches).chunks(r.chunks)).layout;
  std::vector<double> s(static_cast<size_t>(r.stages), 0.0);
  size_t first = 0;
  for (size_t v = 0; v < p.balance.size(); ++v) {
    const auto stage = static_cast<size_t>(layout.placement(static_cast<int>(v)).stage);
    for (size_t i = first; i < first + static_cast<size_t>(p.balance[v]); ++i)
      s[stage] += p.micro_batches * (c.forward[i] + c.backward_input[i] + c.backward_weight[i]);
    first += static_cast<size_t>(p.balance[v]);
  }
  return s;
}

}  // namespace split_choice_detail

SplitChoice choose_split(const SplitRequest& r) {
  if (r.search.costs.empty()) throw ConfigError("choose_split: no layer costs to choose a split from");
  schedule::PlanSearchOptions o = r.search;
  o.processes = r.search.processes > 0 ? r.search.processes : r.stages;
  std::vector<schedule::Plan> plans;
  std::string last_error;
  for (const auto& [m, costs] : o.costs) {
    try {
      plans.push_back(schedule::evaluate_plan(o, r.kind, r.stages, m, r.chunks, r.checkpoint));
    } catch (const Error& e) {
      last_error = e.what();  // this count cannot be generated for the kind (e.g. M < 2P)
    }
  }
  if (plans.empty())
    throw ConfigError(fmt::format("no candidate micro-batch count can run {} on {} stages: {}", schedule::kind_name(r.kind),
                                  r.stages, last_error));
  const schedule::Plan* best = nullptr;
  bool within = false;
  for (const auto& p : plans) {
    const bool ok = p.bubble <= r.bubble_target;
    // A candidate within the target beats any outside it; then the faster; ties: fewer
    // micro-batches (larger ones use the cores better than the prediction knows).
    if (!best || (ok && !within) ||
        (ok == within && (p.step_s < best->step_s ||
                          (p.step_s == best->step_s && p.micro_batches < best->micro_batches)))) {
      best = &p;
      within = ok;
    }
  }
  SplitChoice c;
  c.balance = best->balance;
  c.micro_batches = best->micro_batches;
  c.micro_batch_size = r.rows > 0 ? r.rows / best->micro_batches : 0;
  c.stage_s = split_choice_detail::stage_seconds(r, *best);
  c.bubble = best->bubble;
  c.step_s = best->step_s;
  c.within_target = within;
  std::vector<long> ms;
  for (double s : c.stage_s) ms.push_back(std::lround(s * 1e3));
  c.line = fmt::format("split {} by {} (stage times {} ms), {} micro-batches of {}: simulated bubble {:.0f}%, {}",
                       format_balance(c.balance), r.source, fmt::join(ms, "/"), c.micro_batches, c.micro_batch_size,
                       100 * c.bubble,
                       plans.size() == 1 ? fmt::format("predicted step {:.0f} ms", 1e3 * c.step_s)
                       : within ? fmt::format("the fastest predicted step ({:.0f} ms) of {} micro-batch counts with "
                                              "bubble <= {:.0f}%",
                                              1e3 * c.step_s, plans.size(), 100 * r.bubble_target)
                                : fmt::format("the fastest predicted step ({:.0f} ms); no count of {} reaches bubble "
                                              "<= {:.0f}%",
                                              1e3 * c.step_s, plans.size(), 100 * r.bubble_target));
  return c;
}

}  // namespace pipetrain::apps
