// The simulator: replay with the cost model, then makespan, bubble and memory per stage.
#include "pipetrain/schedule/simulate.h"

#include <map>
#include <tuple>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pipetrain/error.h"
#include "pipetrain/schedule/validate.h"
#include "replay.h"

namespace pipetrain::schedule {
namespace {

void check_costs(const char* name, const std::vector<double>& values, int num_stages) {
  if (static_cast<int>(values.size()) != num_stages)
    throw ConfigError(fmt::format("cost model: {} has {} entries, expected one per stage ({})",
                                  name, values.size(), num_stages));
  for (size_t j = 0; j < values.size(); ++j)
    if (!std::isfinite(values[j]) || values[j] < 0)
      throw ConfigError(fmt::format("cost model: {} of stage {} is {}; costs are finite and >= 0",
                                    name, j, values[j]));
}

}  // namespace

CostModel CostModel::uniform(int num_stages, double forward, double backward_input,
                             double backward_weight, double transfer) {
  const size_t n = static_cast<size_t>(std::max(num_stages, 0));
  // Member by member: an aggregate initialiser would leave send and memory to GCC's
  // missing-initializer warning.
  CostModel c;
  c.forward.assign(n, forward);
  c.backward_input.assign(n, backward_input);
  c.backward_weight.assign(n, backward_weight);
  c.transfer.assign(n, transfer);
  return c;
}

std::vector<TimedEvent> SimulationResult::events() const {
  std::vector<TimedEvent> out;
  for (const auto& row : timeline)
    for (const TimedAction& t : row)
      out.push_back(
          {t.action.stage, t.action.op, t.action.micro_batch, t.action.chunk, t.start, t.end});
  for (const auto& row : fills) out.insert(out.end(), row.begin(), row.end());
  return out;
}

CostModel estimate_costs(const std::vector<TimedEvent>& events, int num_stages, int num_chunks,
                         double transfer) {
  CostModel costs = CostModel::uniform(num_stages, 0, 0, 0, transfer);
  std::vector<std::vector<double>> sum(kNumOps, std::vector<double>(num_stages, 0.0));
  std::vector<std::vector<int>> count(kNumOps, std::vector<int>(num_stages, 0));
  for (const TimedEvent& e : events) {
    if (e.stage < 0 || e.stage >= num_stages) continue;
    sum[static_cast<int>(e.op)][e.stage] += e.end - e.start;
    // Work of no micro-batch in particular (a wait filled with weight gradients) adds to the
    // time of its kind without being an action of its own.
    if (e.micro_batch >= 0) ++count[static_cast<int>(e.op)][e.stage];
  }
  auto mean = [&](Op op, int j) {
    const int n = count[static_cast<int>(op)][j];
    return n == 0 ? 0.0 : sum[static_cast<int>(op)][j] / n * num_chunks;
  };
  costs.send.assign(static_cast<size_t>(std::max(num_stages, 0)), 0.0);
  for (int j = 0; j < num_stages; ++j) {
    // Both kinds of send cost the same to post (the per-chunk split does not apply).
    const int sends = count[static_cast<int>(Op::send_activation)][j] + count[static_cast<int>(Op::send_grad)][j];
    if (sends > 0)
      costs.send[j] = (sum[static_cast<int>(Op::send_activation)][j] + sum[static_cast<int>(Op::send_grad)][j]) / sends;
    if (count[static_cast<int>(Op::forward)][j] == 0)
      throw ConfigError(
          fmt::format("estimate_costs: stage {} has no forward events; record "
                      "compute events on every stage of the run",
                      j));
    costs.forward[j] = mean(Op::forward, j);
    if (count[static_cast<int>(Op::backward)][j] > 0) {
      costs.backward_input[j] = mean(Op::backward, j);
    } else {
      costs.backward_input[j] = mean(Op::backward_input, j);
      costs.backward_weight[j] = mean(Op::backward_weight, j);
    }
  }
  return costs;
}

double estimate_transfer(const Schedule& schedule, const std::vector<TimedEvent>& events) {
  // (stage, op, chunk, micro-batch) -> event, for the sends
  std::map<std::tuple<int, int, int, int>, const TimedEvent*> sends;
  for (const auto& e : events) {
    if (is_send(e.op)) sends[{e.stage, static_cast<int>(e.op), e.chunk, e.micro_batch}] = &e;
  }
  // (stage, op, chunk, micro-batch) of a receive -> its sender's (stage, chunk)
  std::map<std::tuple<int, int, int, int>, std::pair<int, int>> peers;
  for (const auto& stage : schedule.stages) {
    for (const auto& a : stage) {
      if (is_recv(a.op)) peers[{a.stage, static_cast<int>(a.op), a.chunk, a.micro_batch}] = {a.peer_stage, a.peer_chunk};
    }
  }
  std::vector<double> samples;
  for (const auto& e : events) {
    if (!is_recv(e.op)) continue;
    const auto peer = peers.find({e.stage, static_cast<int>(e.op), e.chunk, e.micro_batch});
    if (peer == peers.end() || peer->second.first == e.stage) continue;
    const Op send_op = e.op == Op::recv_activation ? Op::send_activation : Op::send_grad;
    const auto send = sends.find({peer->second.first, static_cast<int>(send_op), peer->second.second, e.micro_batch});
    if (send == sends.end()) continue;
    if (e.start <= send->second->end && e.end >= send->second->end) samples.push_back(e.end - send->second->end);
  }
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

SimulationResult simulate(const Schedule& schedule, const CostModel& costs) {
  const int P = schedule.num_stages();
  check_costs("forward", costs.forward, P);
  check_costs("backward_input", costs.backward_input, P);
  check_costs("backward_weight", costs.backward_weight, P);
  check_costs("transfer", costs.transfer, P);
  if (!costs.send.empty()) check_costs("send", costs.send, P);
  if (!std::isfinite(costs.cores) || costs.cores < 0)
    throw ConfigError(fmt::format("cost model: cores is {}; give a number of cores > 0, or 0 for a core per stage",
                                  costs.cores));
  if (!(costs.shared_efficiency > 0 && costs.shared_efficiency <= 1))
    throw ConfigError(fmt::format("cost model: shared_efficiency is {}; it is a fraction in (0, 1]",
                                  costs.shared_efficiency));
  if (!std::isfinite(costs.message_work) || costs.message_work < 0)
    throw ConfigError(fmt::format("cost model: message_work is {}; costs are finite and >= 0", costs.message_work));
  validate(schedule);

  const double V = schedule.num_chunks();
  detail::ReplayCosts replay_costs;
  replay_costs.transfer = costs.transfer;
  replay_costs.fill_waits = costs.fill_waits;
  replay_costs.op.resize(P);
  for (int j = 0; j < P; ++j) {
    auto& op = replay_costs.op[j];
    op.fill(0.0);
    op[static_cast<int>(Op::forward)] = costs.forward[j] / V;
    op[static_cast<int>(Op::backward_input)] = costs.backward_input[j] / V;
    op[static_cast<int>(Op::backward_weight)] = costs.backward_weight[j] / V;
    op[static_cast<int>(Op::backward)] = (costs.backward_input[j] + costs.backward_weight[j]) / V;
    if (!costs.send.empty()) {
      op[static_cast<int>(Op::send_activation)] = costs.send[j];
      op[static_cast<int>(Op::send_grad)] = costs.send[j];
    }
  }
  replay_costs.shared_efficiency = costs.shared_efficiency;
  // Only ranks that share cores pay for their messages (CostModel::message_work).
  replay_costs.message_work = costs.cores > 0 && costs.cores < P ? costs.message_work : 0.0;
  const detail::ReplayResult replayed = costs.cores > 0 ? detail::replay_shared(schedule, replay_costs, costs.cores)
                                                        : detail::replay(schedule, replay_costs);

  SimulationResult result;
  result.timeline.resize(P);
  for (int j = 0; j < P; ++j) {
    const auto& actions = schedule.stages[j];
    result.timeline[j].reserve(actions.size());
    for (size_t k = 0; k < actions.size(); ++k)
      result.timeline[j].push_back({actions[k], replayed.start[j][k], replayed.end[j][k]});
  }
  // Every stage starts at 0, so the makespan is the last end (bubble_stats() computes the same
  // from events; this avoids copying a large timeline once more).
  result.busy.assign(P, 0.0);
  result.bubble.assign(P, 0.0);
  result.fills.resize(P);
  double total = 0;
  for (int j = 0; j < P; ++j) {
    for (const TimedAction& t : result.timeline[j]) {
      result.makespan = std::max(result.makespan, t.end);
      if (is_compute(t.action.op)) result.busy[j] += t.end - t.start;
    }
    for (const detail::ReplayFill& f : replayed.fills[j]) {
      result.fills[j].push_back({j, Op::backward_weight, -1, 0, f.start, f.end});
      result.makespan = std::max(result.makespan, f.end);
      result.busy[j] += f.end - f.start;
    }
    total += result.busy[j];
  }
  if (result.makespan > 0) {
    for (int j = 0; j < P; ++j) result.bubble[j] = 1.0 - result.busy[j] / result.makespan;
    result.bubble_overall = 1.0 - total / (P * result.makespan);
  }
  result.peak_live_activations = peak_live_activations(schedule);
  for (int peak : result.peak_live_activations) result.peak_activation_memory.push_back(peak / V);
  if (!costs.memory.empty()) result.peak_memory_bytes = peak_memory_bytes(schedule, costs.memory);
  return result;
}

}  // namespace pipetrain::schedule
