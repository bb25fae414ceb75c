// PipelineEngine: the measured timeline of a step, gathered over the pipeline, and its bubble
// next to the simulator's prediction.
#include <algorithm>
#include <limits>

#include "pipetrain/comm/clock_sync.h"
#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/schedule/simulate.h"

namespace pipetrain {

std::vector<schedule::TimedEvent> PipelineEngine::gather_events(const std::vector<schedule::TimedEvent>& local) {
  auto& group = *groups_.pipeline;
  // Each stage timed its events on its own host's steady clock: put them all on the first
  // stage's clock before comparing them (comm/clock_sync.h). Estimated once: the same events
  // gathered again must give the same times, and on one host the clocks are one.
  if (clock_offsets_.empty()) {
    clock_offsets_ = comm::all_on_one_host(group) ? std::vector<double>(static_cast<size_t>(group.size()), 0.0)
                                                  : comm::estimate_clock_offsets(group, comm_->rank());
  }
  const auto& offsets = clock_offsets_;
  const double longest = group.all_reduce_scalar(static_cast<double>(local.size()), comm::ReduceOp::Max,
                                                 "trace event count");
  const auto n = static_cast<int64_t>(longest);
  constexpr int64_t kFields = 5;  // op + 1 (0 = empty), micro-batch, chunk, start, end
  auto table = torch::zeros({num_stages(), std::max<int64_t>(n, 1), kFields}, torch::kDouble);
  auto rows = table.accessor<double, 3>();
  for (size_t i = 0; i < local.size(); ++i) {
    const auto& e = local[i];
    rows[stage()][static_cast<int64_t>(i)][0] = static_cast<double>(e.op) + 1;
    rows[stage()][static_cast<int64_t>(i)][1] = e.micro_batch;
    rows[stage()][static_cast<int64_t>(i)][2] = e.chunk;
    rows[stage()][static_cast<int64_t>(i)][3] = e.start;
    rows[stage()][static_cast<int64_t>(i)][4] = e.end;
  }
  std::vector<torch::Tensor> v{table};
  group.all_reduce(v, comm::ReduceOp::Sum, "trace events");
  std::vector<schedule::TimedEvent> events;
  double origin = std::numeric_limits<double>::infinity();
  for (int s = 0; s < num_stages(); ++s) {
    for (int64_t i = 0; i < n; ++i) {
      if (rows[s][i][0] == 0) continue;
      schedule::TimedEvent e;
      e.stage = s;
      e.op = schedule::op_from_index(static_cast<int>(rows[s][i][0]) - 1);
      e.micro_batch = static_cast<int>(rows[s][i][1]);
      e.chunk = static_cast<int>(rows[s][i][2]);
      const double offset = offsets.at(static_cast<size_t>(group.index_of(topology_.rank_of(s, replica(), tensor_rank()))));
      e.start = rows[s][i][3] - offset;
      e.end = rows[s][i][4] - offset;
      origin = std::min(origin, e.start);
      events.push_back(e);
    }
  }
  for (auto& e : events) {
    e.start -= origin;
    e.end -= origin;
  }
  return events;
}

BubbleReport PipelineEngine::measure_bubble(const std::vector<schedule::TimedEvent>& local) {
  auto events = gather_events(local);
  // The step actions (reductions, optimizer) are outside the schedule's timeline in the
  // simulator too: compare the pipelined part only.
  std::vector<schedule::TimedEvent> body;
  for (const auto& e : events) {
    if (!schedule::is_step(e.op)) body.push_back(e);
  }
  BubbleReport report;
  if (body.empty()) return report;
  const auto measured = schedule::bubble_stats(body, num_stages());
  report.measured = measured.overall;
  report.makespan_s = measured.makespan;
  report.transfer_s = schedule::estimate_transfer(train_schedule_, body);
  auto costs = schedule::estimate_costs(body, num_stages(), num_chunks(), report.transfer_s);
  // The executor fills waits with queued weight work where a stage accumulates natively: the
  // simulation must run the same policy to predict this run.
  const bool native = std::any_of(chunks_.begin(), chunks_.end(), [](const auto& c) { return c->accumulates_natively(); });
  costs.fill_waits = groups_.pipeline->all_reduce_scalar(native ? 1.0 : 0.0, comm::ReduceOp::Max, "native weight work") > 0;
  report.simulated = schedule::simulate(train_schedule_, costs).bubble_overall;
  return report;
}

}  // namespace pipetrain
