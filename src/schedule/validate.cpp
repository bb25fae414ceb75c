// The validator's entry points: the passes in order, the deadlock check and the report.
#include "pipetrain/schedule/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "pipetrain/error.h"
#include "pipetrain/schedule/format.h"
#include "replay.h"
#include "validate_internal.h"

namespace pipetrain::schedule {
namespace detail {
namespace {

// Position of the send that `recv` waits for on its peer's list.
int find_send(const Schedule& s, const Action& recv) {
  const auto& actions = s.stages[recv.peer_stage];
  const size_t m = message_of(s, recv);
  for (int k = 0; k < static_cast<int>(actions.size()); ++k)
    if (is_send(actions[k].op) && message_of(s, actions[k]) == m) return k;
  return -1;
}

}  // namespace

std::optional<ScheduleProblem> check_deadlock(const Schedule& s) {
  ReplayCosts unit;
  std::array<double, kNumOps> costs{};
  for (int op = 0; op < kNumOps; ++op) costs[op] = is_compute(static_cast<Op>(op)) ? 1.0 : 0.0;
  unit.op.assign(s.num_stages(), costs);
  unit.transfer.assign(s.num_stages(), 1.0);
  const ReplayResult r = replay(s, unit, /*record_times=*/false);
  if (r.finished) return std::nullopt;
  // Every blocked stage waits in a receive for a stage that is itself blocked (matching
  // passed, so the send exists but lies beyond where its stage stopped): follow the waits
  // from the lowest blocked stage until one repeats.
  int j = 0;
  while (r.stopped_at[j] >= static_cast<int>(s.stages[j].size())) ++j;
  std::vector<int> visited(s.num_stages(), -1);
  std::vector<int> chain;
  while (visited[j] < 0) {
    visited[j] = static_cast<int>(chain.size());
    chain.push_back(j);
    j = s.stages[j][r.stopped_at[j]].peer_stage;
  }
  std::vector<int> cycle(chain.begin() + visited[j], chain.end());
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string reason = fmt::format("deadlock, a cycle of {} stage(s): ", cycle.size());
  ScheduleProblem problem;
  for (size_t n = 0; n < cycle.size(); ++n) {
    const int stage = cycle[n];
    const int k = r.stopped_at[stage];
    const Action& recv = s.stages[stage][k];
    const int send_at = find_send(s, recv);
    reason += fmt::format(
        "{}stage {} is blocked at position {} on {}, which waits for {} at "
        "stage {} position {}",
        n == 0 ? "" : "; ", stage, k, to_string(recv),
        to_string(s.stages[recv.peer_stage][send_at]), recv.peer_stage, send_at);
    if (n == 0) {
      problem.stage = stage;
      problem.position = k;
    } else {
      problem.related.emplace_back(stage, k);
    }
  }
  reason += cycle.size() == 1
                ? " (the send comes later on the blocked stage itself)"
                : "; each of these sends comes after the receive that blocks its own stage";
  problem.reason = reason;
  return problem;
}

}  // namespace detail

std::optional<ScheduleProblem> find_problem(const Schedule& s) {
  const int P = s.num_stages();
  if (static_cast<int>(s.stages.size()) != P)
    return ScheduleProblem{
        -1, -1, fmt::format("{} stage lists for a layout of {} stages", s.stages.size(), P), {}};
  if (static_cast<int>(s.buffers.size()) != P)
    return ScheduleProblem{
        -1, -1, fmt::format("{} buffer counts for {} stages", s.buffers.size(), P), {}};
  if (s.num_micro_batches < 1)
    return ScheduleProblem{
        -1,
        -1,
        fmt::format("{} micro-batches; a schedule has at least 1", s.num_micro_batches),
        {}};
  for (int j = 0; j < P; ++j)
    if (auto p = detail::check_stage_order(s, j)) return p;
  if (auto p = detail::check_matching(s)) return p;
  for (int j = 0; j < P; ++j)
    if (auto p = detail::check_stage_complete(s, j)) return p;
  for (int j = 0; j < P; ++j)
    if (auto p = detail::check_stage_slots(s, j)) return p;
  return detail::check_deadlock(s);
}

std::string describe_problem(const Schedule& s, const ScheduleProblem& p) {
  std::string out = fmt::format(
      "invalid {} schedule ({} stages, {} micro-batches, {} chunk(s) "
      "per stage): ",
      kind_name(s.kind), s.num_stages(), s.num_micro_batches, s.num_chunks());
  const bool on_stage = p.stage >= 0 && p.stage < static_cast<int>(s.stages.size());
  const bool at_action =
      on_stage && p.position >= 0 && p.position < static_cast<int>(s.stages[p.stage].size());
  if (at_action) {
    out += fmt::format("stage {}, position {}, action {}: ", p.stage, p.position,
                       to_string(s.stages[p.stage][p.position]));
  } else if (on_stage) {
    out += fmt::format("stage {}: ", p.stage);
  }
  out += p.reason;
  if (at_action) {
    std::vector<std::pair<int, int>> marks = {{p.stage, p.position}};
    marks.insert(marks.end(), p.related.begin(), p.related.end());
    out += "\n" + format_grid(s, marks);
  }
  return out;
}

void validate(const Schedule& s) {
  if (auto problem = find_problem(s)) throw ScheduleError(describe_problem(s, *problem));
}

std::vector<int> peak_live_activations(const Schedule& s) {
  std::vector<int> peak(s.stages.size(), 0);
  for (size_t j = 0; j < s.stages.size(); ++j) {
    int live = 0;
    for (const Action& a : s.stages[j]) {
      if (a.op == Op::forward) {
        peak[j] = std::max(peak[j], live + 1);
        if (s.training) ++live;
      } else if (a.op == Op::backward || a.op == Op::backward_weight) {
        --live;
      }
    }
  }
  return peak;
}

}  // namespace pipetrain::schedule
