// Replaying a schedule whose ranks share fewer cores than there are stages: one clock for all
// stages, and at every moment the ranks that can run share the cores equally.
//
// replay() gives every stage a core of its own and so cannot see what four ranks on two cores
// lose: while the pipeline fills and drains, fewer ranks can run than there are cores, and the
// cores idle although the bound "all work over the cores" says they never do. Here each rank
// that has work runs at min(1, cores / runnable) of its own speed (processor sharing, which
// the kernel's fair scheduler approximates over its time slices), and everything else follows
// replay()'s semantics: blocking receives, sends that cost the sender their posting and arrive
// `transfer` later, and with fill_waits the engine's queued weight work (replay.cpp). With as
// many cores as stages the timings equal replay()'s. Two costs of sharing come on top
// (ReplayCosts): while the ranks with work outnumber the cores they run at shared_efficiency
// of their share, and each message between stages costs its two ranks message_work (half
// added to the send's posting, half taken up once it has arrived).
#include <algorithm>
#include <cstddef>
#include <deque>
#include <limits>
#include <tuple>
#include <vector>

#include "replay.h"

namespace pipetrain::schedule::detail {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

// What a stage is doing between two events.
enum class Task {
  action,  // the compute or send at position k (left: its work still to do)
  recv,    // waiting at the receive at position k; fills its wait with queued work (fill_waits)
  take,    // the receive at position k has its message: the rank's share of the message's work
  group,   // a group of W actions from position k to group.end, run from the queue
  drain,   // queued work before the step action at position k, or (k past the end) before stopping
  done,
};

struct Stage {
  Task task = Task::done;
  int k = 0;
  double left = 0;
  double since = 0;           // when the current action, group or wait began
  double fill_from = -1;      // start of the current run of queued work outside an action (-1: none)
  std::deque<Queued> queue;   // W work queued by backward_input
  WeightGroup group;          // the W group at position k
  size_t group_until = kNone; // the message whose arrival pauses it
};

class SharedReplay {
 public:
  SharedReplay(const Schedule& s, const ReplayCosts& costs, double cores)
      : s_(s), c_(costs), cores_(cores), P_(s.num_stages()), st_(static_cast<size_t>(P_)),
        arrival_(message_count(s), -1.0) {
    r_.stopped_at.assign(P_, 0);
    r_.start.resize(P_);
    r_.end.resize(P_);
    r_.fills.resize(P_);
    for (int j = 0; j < P_; ++j) {
      r_.start[j].assign(s.stages[j].size(), 0.0);
      r_.end[j].assign(s.stages[j].size(), 0.0);
    }
  }

  ReplayResult run() {
    for (int j = 0; j < P_; ++j) enter(j, 0);
    while (true) {
      settle_all();
      // Who runs now, on what, and when the next thing happens.
      std::vector<double> work(static_cast<size_t>(P_));
      std::vector<size_t> item(static_cast<size_t>(P_));
      int runnable = 0;
      for (int j = 0; j < P_; ++j) {
        item[static_cast<size_t>(j)] = front(j);
        work[static_cast<size_t>(j)] = work_left(j);
        runnable += work[static_cast<size_t>(j)] > 0 ? 1 : 0;
      }
      // Ranks that outnumber the cores also lose to switching between them (shared_efficiency).
      const double rate = runnable > cores_ ? cores_ / runnable * c_.shared_efficiency : 1.0;
      double next = kNever;
      for (int j = 0; j < P_; ++j) {
        if (work[static_cast<size_t>(j)] > 0) next = std::min(next, now_ + work[static_cast<size_t>(j)] / rate);
        const size_t m = awaited(j);
        if (m != kNone && arrival_[m] > now_) next = std::min(next, arrival_[m]);
      }
      if (next == kNever) break;  // everyone finished, or blocked for good
      const double dt = next - now_;
      const double from = now_;
      now_ = next;
      for (int j = 0; j < P_; ++j) {
        const double w = work[static_cast<size_t>(j)];
        if (w <= 0) continue;
        // Whoever was due at `next` finishes exactly: the same sum decided `next`, so no
        // rounding leftover can stall the clock.
        consume(j, item[static_cast<size_t>(j)], from + w / rate <= next ? w : dt * rate, from);
      }
    }
    for (int j = 0; j < P_; ++j) {
      r_.stopped_at[j] = st_[static_cast<size_t>(j)].k;
      if (r_.stopped_at[j] < static_cast<int>(s_.stages[j].size())) r_.finished = false;
    }
    return r_;
  }

 private:
  const std::vector<Action>& actions(int j) const { return s_.stages[static_cast<size_t>(j)]; }
  double cost(int j, Op op) const { return c_.op[static_cast<size_t>(j)][static_cast<int>(op)]; }

  // The queued item the stage works on now (kNone: none).
  size_t front(int j) const {
    const Stage& g = st_[static_cast<size_t>(j)];
    switch (g.task) {
      case Task::recv: {
        const Action& a = actions(j)[static_cast<size_t>(g.k)];
        const size_t m = message_of(s_, a);
        const bool waiting = arrival_[m] < 0 || arrival_[m] > now_;
        return c_.fill_waits && a.peer_stage != j && waiting && !g.queue.empty() ? 0 : kNone;
      }
      case Task::drain:
        return g.queue.empty() ? kNone : 0;
      case Task::group: {
        const int chunk = actions(j)[static_cast<size_t>(g.k)].chunk;
        const size_t reach = weight_group_reach(g.queue, chunk, g.group.mbs);
        for (size_t i = 0; i < reach; ++i)
          if (g.queue[i].chunk == chunk) return i;
        return kNone;
      }
      default:
        return kNone;
    }
  }
  double work_left(int j) const {
    const Stage& g = st_[static_cast<size_t>(j)];
    if (g.task == Task::action || g.task == Task::take) return g.left;
    const size_t i = front(j);
    return i == kNone ? 0.0 : g.queue[i].left;
  }
  // The message whose arrival changes what the stage does (kNone: none).
  size_t awaited(int j) const {
    const Stage& g = st_[static_cast<size_t>(j)];
    if (g.task == Task::recv) return message_of(s_, actions(j)[static_cast<size_t>(g.k)]);
    if (g.task == Task::group) return g.group_until;
    return kNone;
  }

  // Stage j did `amount` of its current work (queue item i, kNone: its action) since `from`.
  void consume(int j, size_t i, double amount, double from) {
    Stage& g = st_[static_cast<size_t>(j)];
    if (g.task == Task::action || g.task == Task::take) {
      g.left = std::max(0.0, g.left - amount);
      return;
    }
    // Queued work outside a group is a fill: recorded as one run until it stops.
    if (g.task != Task::group && g.fill_from < 0) g.fill_from = from;
    Queued& q = g.queue[i];
    q.left -= amount;
    if (q.left <= 0) g.queue.erase(g.queue.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Ends a run of fill work; what follows it begins now.
  void close_fill(int j) {
    Stage& g = st_[static_cast<size_t>(j)];
    if (g.fill_from < 0) return;
    // A run shorter than rounding (two events a few ulps apart) is none.
    if (now_ - g.fill_from > 1e-12 * std::max(1.0, now_))
      r_.fills[static_cast<size_t>(j)].push_back({g.fill_from, now_});
    g.fill_from = -1;
    g.since = now_;
  }

  void record(int j, int k, double begin, double end) {
    r_.start[static_cast<size_t>(j)][static_cast<size_t>(k)] = begin;
    r_.end[static_cast<size_t>(j)][static_cast<size_t>(k)] = end;
  }

  // Starts position k of stage j at now_.
  void enter(int j, int k) {
    Stage& g = st_[static_cast<size_t>(j)];
    g.k = k;
    g.since = now_;
    const auto& list = actions(j);
    if (k >= static_cast<int>(list.size())) {
      g.task = c_.fill_waits ? Task::drain : Task::done;
      return;
    }
    const Action& a = list[static_cast<size_t>(k)];
    if (is_recv(a.op)) {
      g.task = Task::recv;
    } else if (c_.fill_waits && a.op == Op::backward_weight) {
      g.task = Task::group;
      g.group = weight_group_at(list, static_cast<size_t>(k), j);
      g.group_until = g.group.paused_by ? message_of(s_, *g.group.paused_by) : kNone;
    } else if (c_.fill_waits && is_step(a.op) && !g.queue.empty()) {
      g.task = Task::drain;  // the rest of the queue, before the step
    } else {
      g.task = Task::action;
      g.left = cost(j, a.op) + (is_send(a.op) && a.peer_stage != j ? c_.message_work / 2 : 0.0);
    }
  }

  // Settles every stage, again while one's progress (a send arriving at once) frees another.
  void settle_all() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int j = 0; j < P_; ++j) {
        const Stage& g = st_[static_cast<size_t>(j)];
        const auto before = std::make_tuple(g.k, g.task, g.queue.size());
        settle(j);
        moved = moved || before != std::make_tuple(g.k, g.task, g.queue.size());
      }
    }
  }

  // Moves stage j on through everything that is over at now_.
  void settle(int j) {
    Stage& g = st_[static_cast<size_t>(j)];
    const auto& list = actions(j);
    while (g.task != Task::done) {
      const int n = static_cast<int>(list.size());
      if (g.task == Task::action) {
        if (g.left > 0) return;
        const Action& a = list[static_cast<size_t>(g.k)];
        record(j, g.k, g.since, now_);
        if (is_send(a.op))
          arrival_[message_of(s_, a)] = now_ + (a.peer_stage == j ? 0.0 : c_.transfer[static_cast<size_t>(j)]);
        if (c_.fill_waits && a.op == Op::backward_input && cost(j, Op::backward_weight) > 0)
          g.queue.push_back({a.chunk, a.micro_batch, cost(j, Op::backward_weight)});
        enter(j, g.k + 1);
      } else if (g.task == Task::recv) {
        const size_t m = message_of(s_, list[static_cast<size_t>(g.k)]);
        if (front(j) != kNone) return;  // still filling the wait
        close_fill(j);                  // the receive begins after its fill
        if (arrival_[m] < 0 || arrival_[m] > now_) return;
        if (list[static_cast<size_t>(g.k)].peer_stage != j && c_.message_work > 0) {
          g.task = Task::take;
          g.left = c_.message_work / 2;
          continue;
        }
        record(j, g.k, g.since, now_);
        enter(j, g.k + 1);
      } else if (g.task == Task::take) {
        if (g.left > 0) return;
        record(j, g.k, g.since, now_);
        enter(j, g.k + 1);
      } else if (g.task == Task::group) {
        const bool paused =
            g.group_until != kNone && arrival_[g.group_until] >= 0 && arrival_[g.group_until] <= now_;
        if (!paused && front(j) != kNone) return;
        // The group's span split evenly over its actions, as replay() records it.
        const int end = static_cast<int>(g.group.end);
        const double each = (now_ - g.since) / static_cast<double>(end - g.k);
        for (int i = g.k; i < end; ++i) record(j, i, g.since + each * (i - g.k), g.since + each * (i - g.k + 1));
        enter(j, end);
      } else {  // drain
        if (front(j) != kNone) return;
        close_fill(j);
        if (g.k >= n) {
          g.task = Task::done;
        } else {
          g.task = Task::action;
          g.since = now_;
          g.left = cost(j, list[static_cast<size_t>(g.k)].op);
        }
      }
    }
  }

  const Schedule& s_;
  const ReplayCosts& c_;
  double cores_;
  int P_;
  std::vector<Stage> st_;
  std::vector<double> arrival_;
  double now_ = 0;
  ReplayResult r_;
};

}  // namespace

ReplayResult replay_shared(const Schedule& schedule, const ReplayCosts& costs, double cores) {
  return SharedReplay(schedule, costs, cores).run();
}

}  // namespace pipetrain::schedule::detail
