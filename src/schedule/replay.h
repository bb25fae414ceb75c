// Replaying a schedule under the execution semantics of action.h (internal to the layer).
#pragma once

#include <array>
#include <cstddef>
#include <deque>
#include <limits>
#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule::detail {

// The time of an event that never comes.
constexpr double kNever = std::numeric_limits<double>::infinity();

struct ReplayCosts {
  std::vector<std::array<double, kNumOps>> op;  // per stage, per op: duration (sends: posting)
  std::vector<double> transfer;                 // per stage: cost of a transfer it sends
  bool fill_waits = false;                      // CostModel::fill_waits
  double shared_efficiency = 1;                 // CostModel::shared_efficiency (replay_shared)
  double message_work = 0;                      // CostModel::message_work (replay_shared)
};

// One micro-batch's weight-gradient work that its input-gradient backward queued
// (CostModel::fill_waits), in the order the backwards ran, as the engine's accumulator takes it.
struct Queued {
  int chunk = 0;
  int micro_batch = 0;
  double left = 0;
};

// A run of consecutive W actions of one chunk, which the executor runs as one group from the
// queue (fill_waits): positions [k, end) of the stage's list, their micro-batches, and the
// receive right after them whose message pauses the group (null: none).
struct WeightGroup {
  size_t end = 0;
  std::vector<int> mbs;
  const Action* paused_by = nullptr;
};
WeightGroup weight_group_at(const std::vector<Action>& actions, size_t k, int stage);

// How many of the queue's first items a group of `chunk` for `mbs` may run through: up to the
// last of its micro-batches in the queue (0: none); it runs only its chunk's among them.
size_t weight_group_reach(const std::deque<Queued>& queue, int chunk, const std::vector<int>& mbs);

// Weight-gradient work run outside its own action (CostModel::fill_waits).
struct ReplayFill {
  double start = 0, end = 0;
};

struct ReplayResult {
  std::vector<std::vector<double>> start, end;  // per stage, per position
  std::vector<std::vector<ReplayFill>> fills;   // per stage, in time order (with record_times)
  std::vector<int> stopped_at;                  // per stage: first position not run
  bool finished = true;                         // false: some stage is blocked forever
};

// Runs every stage as far as the semantics allow. Precondition: the structure checks passed
// (indices in range, every receive matched by exactly one send). Without `record_times` only
// `stopped_at` and `finished` are filled (the deadlock check needs no more).
ReplayResult replay(const Schedule& schedule, const ReplayCosts& costs, bool record_times = true);

// The same semantics with the stages' ranks sharing `cores` CPUs (replay_shared.cpp): one clock,
// and the ranks with work running at min(1, cores / how many have work) of their speed. With
// cores >= stages it equals replay().
ReplayResult replay_shared(const Schedule& schedule, const ReplayCosts& costs, double cores);

// Index of the message a receive waits for: (kind, receiving stage, its chunk, micro-batch).
inline size_t message_index(const Schedule& s, bool grad, int stage, int chunk, int micro_batch) {
  return ((static_cast<size_t>(grad) * s.num_stages() + stage) * s.num_chunks() + chunk) *
             s.num_micro_batches +
         micro_batch;
}
inline size_t message_count(const Schedule& s) {
  return 2 * static_cast<size_t>(s.num_stages()) * s.num_chunks() * s.num_micro_batches;
}
// The message a send or receive refers to.
inline size_t message_of(const Schedule& s, const Action& a) {
  const bool grad = a.op == Op::send_grad || a.op == Op::recv_grad;
  return is_send(a.op) ? message_index(s, grad, a.peer_stage, a.peer_chunk, a.micro_batch)
                       : message_index(s, grad, a.stage, a.chunk, a.micro_batch);
}

}  // namespace pipetrain::schedule::detail
