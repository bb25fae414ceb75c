// The simulator: a schedule plus per-stage costs in, timings, makespan and bubble out.
//
// Costs are per stage for one micro-batch through the stage's whole model part: with V chunks
// per stage each chunk's forward costs forward[j] / V (and so on), so kinds with different
// chunk counts compare on the same model. A full backward costs backward_input + backward_weight.
// A transfer costs transfer[j] for a message sent by stage j (0 for a hand-over to the same
// stage), counted from the end of its send; posting any send keeps the sender for send[j]
// (empty: nothing), time that is neither compute nor waiting for a peer; loads and the step
// actions cost nothing. Timing follows action.h's semantics.
#pragma once

#include <vector>

#include "pipetrain/schedule/memory.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/timeline.h"

namespace pipetrain::schedule {

struct CostModel {
  std::vector<double> forward;          // F per stage
  std::vector<double> backward_input;   // B per stage (input-gradient part)
  std::vector<double> backward_weight;  // W per stage (weight-gradient part)
  std::vector<double> transfer;         // C per sending stage
  std::vector<double> send;             // per stage: posting one send (empty: 0 everywhere)
  // The engine's executor with the native weight-gradient accumulator: each backward_input
  // queues its micro-batch's W work; a stage waiting for a message from another stage runs
  // queued work meanwhile; a group of consecutive W actions of one chunk runs that chunk's
  // queue up to the group's micro-batches but stops when the gradient it precedes has arrived;
  // the step actions run what is left first. Off: every W action costs backward_weight / V
  // where the list puts it.
  bool fill_waits = false;
  // CPU cores the stages' ranks share; 0: a core each. Fewer cores than stages: the ranks take
  // turns, as four processes on two cores do (as many or more: the same timings as 0). At
  // every moment the ranks that have work share the cores equally (processor sharing), so
  // while the pipeline fills and drains, and whenever most ranks wait, cores idle that the
  // bound "all work over the cores" counts as busy. Fractional: a share of a machine
  // (replicas of the pipeline beside it).
  double cores = 0;
  // With shared cores, the share of a core's time that does a rank's work while more ranks can
  // run than there are cores: switching between them costs the rest (the kernel's time, caches
  // refilled). 1: switching is free.
  double shared_efficiency = 1;
  // With fewer cores than stages, the work one message between stages costs its two ranks
  // (half when posted, half when taken up): the communication threads' wake-ups and copies,
  // which on cores of their own hide in the ranks' waits but on shared cores take turns with
  // the compute.
  double message_work = 0;
  // Bytes per stage (memory.h); empty: the result's peak_memory_bytes stays empty.
  std::vector<StageMemory> memory;

  // The same costs on every stage.
  static CostModel uniform(int num_stages, double forward, double backward_input,
                           double backward_weight, double transfer);
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;  // a receive ends when its message is there; a send when it is posted
};

struct SimulationResult {
  double makespan = 0;
  std::vector<double> busy;                        // per stage: compute time (shared cores: as it took)
  std::vector<double> bubble;                      // per stage: idle fraction of the makespan
  double bubble_overall = 0;                       // idle fraction over all stages
  std::vector<int> peak_live_activations;          // per stage, counted per (chunk, micro-batch)
  std::vector<double> peak_activation_memory;      // the same in whole-stage units (count / V)
  std::vector<double> peak_memory_bytes;           // per stage, with CostModel::memory (memory.h)
  std::vector<std::vector<TimedAction>> timeline;  // per stage, in list order
  // Per stage (fill_waits): queued weight work run outside its own actions, as W events of
  // micro-batch -1 like the engine records them; counted in busy.
  std::vector<std::vector<TimedEvent>> fills;

  // Every action (and fill) as a TimedEvent (for the renderers and bubble_stats).
  std::vector<TimedEvent> events() const;
};

// Per-stage costs measured from a run's compute events (e.g. one step of the engine), for
// simulating the schedule it ran with the costs it really had: the mean duration of each
// compute op per stage, times the chunk count (costs are per whole stage); a stage that ran full
// backwards gets backward_input = their mean and backward_weight = 0. Events of no micro-batch
// (-1: weight gradients run while a stage waited) add to their op's time but not to its count.
// `send` is the mean duration of the stage's send events (0 without any).
// Receive times mix transfer and waiting, so `transfer` is given (estimate_transfer measures
// it). Throws ConfigError for a stage without forwards.
CostModel estimate_costs(const std::vector<TimedEvent>& events, int num_stages, int num_chunks,
                         double transfer = 0);

// The transfer latency a measured run shows: for each receive that was already waiting when
// its message was sent (so its end is the message's arrival, not more waiting), the time
// from the end of the matching send (the schedule's peer, same micro-batch) to the end of the
// receive; the median of those, 0 when there are none. Events must share one clock (ranks on
// one host). Pass it to estimate_costs.
double estimate_transfer(const Schedule& schedule, const std::vector<TimedEvent>& events);

// Throws ConfigError for cost vectors of the wrong length or with a negative or non-finite
// entry, and ScheduleError (validate()'s message) for an invalid schedule.
SimulationResult simulate(const Schedule& schedule, const CostModel& costs);

}  // namespace pipetrain::schedule
