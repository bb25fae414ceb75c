// The planner's search: each layout costed by the simulator and the memory model (plan.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pipetrain/error.h"
#include "pipetrain/partition/min_max.h"
#include "pipetrain/schedule/defer_weights.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/plan.h"
#include "pipetrain/schedule/simulate.h"

namespace pipetrain::schedule {
namespace {

double sum_range(const std::vector<double>& v, int64_t begin, int64_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, 0.0);
}

}  // namespace

double Plan::max_peak_memory_bytes() const {
  return peak_memory_bytes.empty() ? 0.0 : *std::max_element(peak_memory_bytes.begin(), peak_memory_bytes.end());
}

Plan evaluate_plan(const PlanSearchOptions& o, ScheduleKind kind, int P, int M, int chunks, int64_t checkpoint) {
  const auto found = o.costs.find(M);
  if (found == o.costs.end())
    throw ConfigError(fmt::format("the planner has no layer costs for {} micro-batches; profile that size first", M));
  const LayerCosts& c = found->second;
  const auto n = static_cast<int64_t>(c.forward.size());
  if (P < 1 || o.processes % P != 0)
    throw ConfigError(fmt::format("{} stages do not divide {} processes", P, o.processes));
  const int R = o.processes / P;

  Schedule s = generate(ScheduleOptions(kind, P, M).chunks(chunks));
  const Layout layout = s.layout;
  const int V = layout.num_chunks();
  const int parts = P * V;
  if (n < parts)
    throw ConfigError(fmt::format("{} layers cannot fill {} model parts ({} stages x {} chunks)", n, parts, P, V));
  if (o.defer_weights) s = defer_weight_gradients(s);

  std::vector<double> layer_time(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) layer_time[i] = c.forward[i] + c.backward_input[i] + c.backward_weight[i];
  Plan plan;
  plan.kind = kind;
  plan.stages = P;
  plan.replicas = R;
  plan.micro_batches = M;
  plan.chunks = V;
  plan.balance = min_max_partition(layer_time, parts);
  const bool ckpt = checkpoint != 0;
  if (ckpt) plan.checkpoint = *std::max_element(plan.balance.begin(), plan.balance.end());

  CostModel costs = CostModel::uniform(P, 0, 0, 0, 0);
  costs.send.assign(static_cast<size_t>(P), o.link.send_s);
  costs.fill_waits = o.fill_waits;
  // More ranks than cores: the replay shares the cores between them (each of the R pipelines
  // gets its share of the machine).
  const bool shared = o.processes > o.cores;
  if (shared) {
    costs.cores = static_cast<double>(o.cores) / R;
    costs.shared_efficiency = o.shared_efficiency;
    costs.message_work = o.shared_message_s;
  }
  costs.memory.assign(static_cast<size_t>(P), StageMemory{});
  std::vector<double> optimizer(static_cast<size_t>(P), 0.0), grad_bytes(static_cast<size_t>(P), 0.0);
  int64_t first = 0;
  for (int v = 0; v < parts; ++v) {
    const int64_t last = first + plan.balance[static_cast<size_t>(v)];
    const auto j = static_cast<size_t>(layout.placement(v).stage);
    const double f = sum_range(c.forward, first, last);
    costs.forward[j] += f;
    costs.backward_input[j] += sum_range(c.backward_input, first, last) + (ckpt ? f : 0.0);
    costs.backward_weight[j] += sum_range(c.backward_weight, first, last);
    optimizer[j] += sum_range(c.optimizer, first, last);
    const double params = sum_range(c.param_bytes, first, last);
    grad_bytes[j] += params;
    const double input = first == 0 ? c.input_bytes : c.output_bytes[static_cast<size_t>(first - 1)];
    const double kept = sum_range(c.activation_bytes, first, last);
    // Of what a micro-batch holds (its input and what its layers keep), the fast path's inputs
    // outlive the graph until their deferred weight gradient. (Under checkpointing they are
    // recomputed and kept from the recompute on: the recompute's transient holds them.)
    const double kept_w =
        c.weight_bytes.empty() || ckpt ? 0.0 : std::min(input + kept, sum_range(c.weight_bytes, first, last));
    StageMemory& m = costs.memory[j];
    m.static_bytes += params + (c.state_bytes.empty() ? params * (1.0 + o.optimizer_state_factor)
                                                      : sum_range(c.state_bytes, first, last));
    m.weight_bytes += kept_w;
    // Under checkpointing a micro-batch keeps its part's input; the recompute holds the rest
    // while that part's backward runs.
    m.activation_bytes += ckpt ? input : input + kept - kept_w;
    if (ckpt) m.transient_bytes = std::max(m.transient_bytes, kept * V);
    if (v + 1 < parts) {
      const double bytes = c.output_bytes[static_cast<size_t>(last - 1)];
      costs.transfer[j] = std::max(costs.transfer[j], o.link.latency_s + bytes / o.link.bytes_per_s);
    }
    first = last;
  }

  if (R > 1)
    for (int j = 0; j < P; ++j)
      costs.memory[static_cast<size_t>(j)].static_bytes +=
          3.0 * std::min(o.allreduce_bucket_bytes, grad_bytes[static_cast<size_t>(j)]);
  const SimulationResult r = simulate(s, costs);
  double step = 0, work = 0, last_end = 0, most_update = 0, all_updates = 0;
  for (int j = 0; j < P; ++j) {
    double end = 0;
    for (const TimedAction& t : r.timeline[static_cast<size_t>(j)])
      if (!is_step(t.action.op)) end = std::max(end, t.end);
    for (const TimedEvent& e : r.fills[static_cast<size_t>(j)]) end = std::max(end, e.end);
    if (o.stream_bytes_per_s > 0) {
      const double streamed = (4.0 + 2.0 * o.optimizer_state_factor) * grad_bytes[static_cast<size_t>(j)];
      optimizer[static_cast<size_t>(j)] = std::max(optimizer[static_cast<size_t>(j)], streamed / o.stream_bytes_per_s);
    }
    const double allreduce =
        R > 1 ? o.link.latency_s + 2.0 * (R - 1) / R * grad_bytes[static_cast<size_t>(j)] / o.link.allreduce_bytes_per_s : 0.0;
    step = std::max(step, end + optimizer[static_cast<size_t>(j)] + allreduce);
    // The stage's compute (not r.busy, which on shared cores is the time it took).
    const double compute = M * (costs.forward[static_cast<size_t>(j)] + costs.backward_input[static_cast<size_t>(j)] +
                                costs.backward_weight[static_cast<size_t>(j)]);
    work += R * (compute + optimizer[static_cast<size_t>(j)]);
    last_end = std::max(last_end, end);
    most_update = std::max(most_update, optimizer[static_cast<size_t>(j)] + allreduce);
    all_updates += R * optimizer[static_cast<size_t>(j)];
  }
  if (shared) {
    // The ends already share the cores; the updates, which start together once the gradient
    // norm is agreed, share them too. The step is still at least all the work over the cores.
    const double updates = std::max(most_update, all_updates / (o.cores * o.shared_efficiency));
    step = std::max(last_end + updates, work / o.cores);
  }
  step += o.step_overhead_s;
  plan.step_s = step;
  plan.samples_per_s = step > 0 ? R * static_cast<double>(o.batch_rows) / step : 0.0;
  plan.bubble = r.bubble_overall;
  plan.peak_memory_bytes = r.peak_memory_bytes;
  return plan;
}

std::vector<Plan> search_plans(const PlanSearchOptions& o) {
  if (o.processes < 1) throw ConfigError(fmt::format("--processes must be at least 1, got {}", o.processes));
  if (o.costs.empty()) throw ConfigError("the planner needs layer costs for at least one micro-batch count");
  const std::vector<ScheduleKind> kinds = o.kinds.empty() ? training_kinds() : o.kinds;
  std::vector<Plan> all;
  for (int P = 1; P <= o.processes; ++P) {
    if (o.processes % P != 0) continue;
    if (!o.stage_counts.empty() && std::find(o.stage_counts.begin(), o.stage_counts.end(), P) == o.stage_counts.end())
      continue;
    for (ScheduleKind kind : kinds) {
      // One stage has no bubble for another order to fill: the others only defer its weight
      // gradients (cnn, 1 x 2: zb-h1 measured 5% below 1f1b), which the costs do not show, so
      // a noisy profile would pick them by chance. A search restricted to other kinds keeps them.
      if (P == 1 && o.kinds.empty() && kind != ScheduleKind::one_f_one_b) continue;
      std::vector<int> chunk_counts{0};  // the kind's own
      if (kind == ScheduleKind::interleaved) chunk_counts = o.interleaved_chunks;
      for (const auto& [M, costs] : o.costs) {
        for (int V : chunk_counts) {
          for (int64_t ckpt : {int64_t{0}, int64_t{1}}) {
            if (ckpt && !o.try_checkpoint) continue;
            try {
              all.push_back(evaluate_plan(o, kind, P, M, V, ckpt));
            } catch (const ScheduleError&) {
              // this kind cannot take these values (e.g. too few layers for its chunks)
            } catch (const ConfigError&) {
            }
          }
        }
      }
    }
  }
  if (all.empty()) throw ConfigError("no layout of this model can be generated over these processes");
  std::vector<Plan> fits;
  double least = INFINITY;
  for (const Plan& p : all) {
    least = std::min(least, p.max_peak_memory_bytes());
    if (o.max_memory_bytes <= 0 || p.max_peak_memory_bytes() <= o.max_memory_bytes) fits.push_back(p);
  }
  if (fits.empty())
    throw ConfigError(fmt::format(
        "no plan fits --max-memory-mb {:.1f}: the least any layout needs is {:.1f} MiB per process; raise the cap "
        "to at least that, or use more processes",
        o.max_memory_bytes / (1 << 20), least / (1 << 20)));
  std::stable_sort(fits.begin(), fits.end(), [](const Plan& a, const Plan& b) {
    if (a.samples_per_s != b.samples_per_s) return a.samples_per_s > b.samples_per_s;
    return a.max_peak_memory_bytes() < b.max_peak_memory_bytes();
  });
  return fits;
}

}  // namespace pipetrain::schedule
