// The one interpreter of schedule timing: stages in list order, async sends, blocking receives.
#include "replay.h"

#include <algorithm>
#include <deque>
#include <limits>

namespace pipetrain::schedule::detail {
namespace {

// A stage's queued weight work.
struct WeightQueue {
  std::deque<Queued> items;

  // Runs queued work from `clock` until it is done or `until` comes: everything (chunk -1), or
  // that chunk's up to the last of `mbs` in the queue. Returns the new clock.
  double run(double clock, double until, int chunk = -1, const std::vector<int>& mbs = {}) {
    size_t stop = chunk >= 0 ? weight_group_reach(items, chunk, mbs) : items.size();
    for (size_t i = 0; i < stop && clock < until;) {
      Queued& q = items[i];
      if (chunk >= 0 && q.chunk != chunk) {
        ++i;
        continue;
      }
      const double d = std::min(q.left, until - clock);
      clock += d;
      q.left -= d;
      if (q.left > 0) continue;  // `until` came
      items.erase(items.begin() + static_cast<std::ptrdiff_t>(i));
      --stop;
    }
    return clock;
  }
};

}  // namespace

WeightGroup weight_group_at(const std::vector<Action>& actions, size_t k, int stage) {
  WeightGroup g;
  const int chunk = actions[k].chunk;
  for (g.end = k; g.end < actions.size() && actions[g.end].op == Op::backward_weight && actions[g.end].chunk == chunk;
       ++g.end)
    g.mbs.push_back(actions[g.end].micro_batch);
  if (g.end < actions.size() && actions[g.end].op == Op::recv_grad && actions[g.end].peer_stage != stage)
    g.paused_by = &actions[g.end];
  return g;
}

size_t weight_group_reach(const std::deque<Queued>& queue, int chunk, const std::vector<int>& mbs) {
  size_t reach = 0;
  for (size_t i = 0; i < queue.size(); ++i)
    if (queue[i].chunk == chunk && std::find(mbs.begin(), mbs.end(), queue[i].micro_batch) != mbs.end()) reach = i + 1;
  return reach;
}

ReplayResult replay(const Schedule& s, const ReplayCosts& costs, bool record_times) {
  const int P = s.num_stages();
  ReplayResult r;
  r.stopped_at.assign(P, 0);
  if (record_times) {
    r.start.resize(P);
    r.end.resize(P);
    r.fills.resize(P);
    for (int j = 0; j < P; ++j) {
      r.start[j].resize(s.stages[j].size());
      r.end[j].resize(s.stages[j].size());
    }
  }
  std::vector<double> arrival(message_count(s), -1.0);  // -1: not sent yet
  std::vector<int> waiter(message_count(s), -1);
  std::vector<double> clock(P, 0.0);
  std::vector<WeightQueue> queues(costs.fill_waits ? P : 0);
  // Runs stage j's queued weight work from its clock until `until`, recording it.
  auto fill = [&](int j, double until) {
    const double begin = clock[j];
    clock[j] = queues[j].run(begin, until);
    if (record_times && clock[j] > begin) r.fills[j].push_back({begin, clock[j]});
  };
  // The same group split evenly over its actions: where the current group's next one starts
  // and how long each takes.
  std::vector<double> group_at(P, 0.0), group_each(P, 0.0);
  std::vector<int> ready;
  ready.reserve(P);
  for (int j = P - 1; j >= 0; --j) ready.push_back(j);
  while (!ready.empty()) {
    const int j = ready.back();
    ready.pop_back();
    const auto& actions = s.stages[j];
    int& k = r.stopped_at[j];
    while (k < static_cast<int>(actions.size())) {
      const Action& a = actions[k];
      double begin = clock[j];
      double end = clock[j];
      if (is_recv(a.op)) {
        const size_t m = message_of(s, a);
        if (arrival[m] < 0) {
          waiter[m] = j;
          break;
        }
        // A stage waiting for a message from another runs queued weight work meanwhile.
        if (costs.fill_waits && a.peer_stage != j && arrival[m] > clock[j]) fill(j, arrival[m]);
        begin = clock[j];
        end = std::max(clock[j], arrival[m]);
      } else if (is_send(a.op)) {
        const size_t m = message_of(s, a);
        // Posting a send is work on the sender (a hand-over to the same stage too: measured
        // costs are a mean over all of a stage's sends, so every send must carry it).
        end = clock[j] + costs.op[j][static_cast<int>(a.op)];
        arrival[m] = end + (a.peer_stage == j ? 0.0 : costs.transfer[j]);
        if (waiter[m] >= 0) {
          ready.push_back(waiter[m]);
          waiter[m] = -1;
        }
      } else if (costs.fill_waits && a.op == Op::backward_weight) {
        // Consecutive W actions of one chunk are one group: it runs the chunk's queue up to its
        // own micro-batches, pausing when the gradient received right after it arrives
        // (stage_executor.cpp); later work waits for a wait to fill or a later group.
        const bool head = k == 0 || actions[k - 1].op != Op::backward_weight || actions[k - 1].chunk != a.chunk;
        if (head) {
          const WeightGroup group = weight_group_at(actions, static_cast<size_t>(k), j);
          double until = kNever;
          if (group.paused_by) {
            // Nothing this stage does before that receive can hold its message back, so
            // waiting here to learn when it comes cannot deadlock.
            const size_t m = message_of(s, *group.paused_by);
            if (arrival[m] < 0) {
              waiter[m] = j;
              break;
            }
            until = arrival[m];
          }
          const double done = queues[j].run(clock[j], until, a.chunk, group.mbs);
          group_at[j] = clock[j];
          group_each[j] = (done - clock[j]) / static_cast<double>(group.end - static_cast<size_t>(k));
        }
        begin = group_at[j];
        end = begin + group_each[j];
        group_at[j] = end;
      } else {
        if (costs.fill_waits && is_step(a.op)) fill(j, kNever);  // the rest, before the step
        begin = clock[j];
        end = clock[j] + costs.op[j][static_cast<int>(a.op)];
        if (costs.fill_waits && a.op == Op::backward_input) {
          const double w = costs.op[j][static_cast<int>(Op::backward_weight)];
          if (w > 0) queues[j].items.push_back({a.chunk, a.micro_batch, w});
        }
      }
      if (record_times) {
        r.start[j][k] = begin;
        r.end[j][k] = end;
      }
      clock[j] = end;
      ++k;
    }
    if (costs.fill_waits && k == static_cast<int>(actions.size())) fill(j, kNever);
  }
  for (int j = 0; j < P; ++j)
    if (r.stopped_at[j] < static_cast<int>(s.stages[j].size())) r.finished = false;
  return r;
}

}  // namespace pipetrain::schedule::detail
