// Validator pass: each action well formed and after the actions that produce its inputs.
#include <fmt/format.h>

#include <array>
#include <vector>

#include "validate_internal.h"

namespace pipetrain::schedule::detail {
namespace {

constexpr int kMicroBatchOps = 9;  // the Op values below reduce_tied_grads
constexpr Op kSteps[] = {Op::reduce_tied_grads, Op::reduce_grads, Op::optimizer_step};

int step_index(Op op) { return op == Op::reduce_tied_grads ? 0 : op == Op::reduce_grads ? 1 : 2; }

// Which neighbour a comm op talks to: +1 = the next virtual stage, -1 = the previous one.
int direction(Op op) { return op == Op::send_activation || op == Op::recv_grad ? +1 : -1; }

}  // namespace

std::string what(const Schedule& s, int chunk, int micro_batch) {
  if (s.num_chunks() == 1) return fmt::format("micro-batch {}", micro_batch);
  return fmt::format("micro-batch {} chunk {}", micro_batch, chunk);
}

std::optional<ScheduleProblem> check_stage_order(const Schedule& s, int j) {
  const auto& actions = s.stages[j];
  const Layout& layout = s.layout;
  const int M = s.num_micro_batches;
  const int V = s.num_chunks();
  const int last = layout.num_virtual_stages() - 1;
  const int buffers = s.buffers[j];
  std::array<int, kMicroBatchOps> none;
  none.fill(-1);
  std::vector<std::array<int, kMicroBatchOps>> seen(static_cast<size_t>(V) * M, none);
  std::vector<int> slot_of(seen.size(), -1);
  std::vector<int> last_load(V, -1);
  std::array<int, 3> step_at = {-1, -1, -1};
  int completed = 0;  // (chunk, micro-batch) pairs whose backward work is done

  for (int k = 0; k < static_cast<int>(actions.size()); ++k) {
    const Action& a = actions[k];
    auto fail = [&](std::string reason) {
      return std::optional<ScheduleProblem>(ScheduleProblem{j, k, std::move(reason), {}});
    };
    const std::string malformed = malformation(a);
    if (!malformed.empty()) return fail(malformed);
    if (a.stage != j) return fail(fmt::format("listed on stage {} but names stage {}", j, a.stage));
    if (a.chunk >= V)
      return fail(fmt::format("chunk {}, but the schedule has {} chunk(s) per stage", a.chunk, V));
    if (is_step(a.op)) {
      if (!s.training) return fail("an inference schedule has no reduce or optimizer actions");
      if (a.chunk != 0) return fail("step actions act on the whole stage: chunk must be 0");
      const int idx = step_index(a.op);
      if (step_at[idx] >= 0)
        return fail(
            fmt::format("second {} (the first is at position {})", op_name(a.op), step_at[idx]));
      if (idx > 0 && step_at[idx - 1] < 0)
        return fail(
            fmt::format("{} before {}: a stage ends with reduce_tied_grads, "
                        "reduce_grads, optimizer_step in this order",
                        op_name(a.op), op_name(kSteps[idx - 1])));
      if (completed < static_cast<int>(seen.size())) {
        for (int c = 0; c < V; ++c)
          for (int i = 0; i < M; ++i) {
            const auto& sn = seen[key_of(s, c, i)];
            const bool done = sn[static_cast<int>(Op::backward)] >= 0 ||
                              sn[static_cast<int>(Op::backward_weight)] >= 0;
            if (!done)
              return fail(
                  fmt::format("{} before the backward of {} is done: the step actions "
                              "come after all backward work of the stage",
                              op_name(a.op), what(s, c, i)));
          }
      }
      step_at[idx] = k;
      continue;
    }
    if (step_at[0] >= 0)
      return fail(
          fmt::format("after the step actions (reduce_tied_grads at position {}) the "
                      "stage runs nothing else",
                      step_at[0]));
    if (a.micro_batch >= M)
      return fail(
          fmt::format("micro-batch {}, but the schedule has {} (0..{})", a.micro_batch, M, M - 1));
    if (a.slot < 0) return fail("no buffer slot assigned (lower() and assign_slots() assign them)");
    if (a.slot >= buffers)
      return fail(fmt::format("slot {}, but the stage has {} buffer(s) (slots 0..{})", a.slot,
                              buffers, buffers - 1));
    const int v = layout.virtual_stage(j, a.chunk);
    const size_t key = key_of(s, a.chunk, a.micro_batch);
    auto& sn = seen[key];
    // Only a failing check spells out the micro-batch: the valid path formats nothing.
    const auto mb = [&] { return what(s, a.chunk, a.micro_batch); };
    if (slot_of[key] >= 0 && slot_of[key] != a.slot)
      return fail(fmt::format("uses slot {}, but {} is in slot {}", a.slot, mb(), slot_of[key]));
    slot_of[key] = a.slot;
    const int op = static_cast<int>(a.op);
    if (sn[op] >= 0)
      return fail(fmt::format("second {} of {} (the first is at position {})", op_name(a.op), mb(),
                              sn[op]));
    if (is_backward(a.op) || a.op == Op::recv_grad || a.op == Op::send_grad) {
      if (!s.training) return fail(fmt::format("an inference schedule has no {}", op_name(a.op)));
    }
    if (is_comm(a.op)) {
      const int neighbour = v + direction(a.op);
      if (neighbour < 0 || neighbour > last)
        return fail(fmt::format("{} on virtual stage {}, which has no {} stage", op_name(a.op), v,
                                neighbour < 0 ? "previous" : "next"));
      const Placement p = layout.placement(neighbour);
      if (a.peer_stage != p.stage || a.peer_chunk != p.chunk)
        return fail(
            fmt::format("peer is stage {} chunk {}, but virtual stage {} lives on stage {} "
                        "chunk {}",
                        a.peer_stage, a.peer_chunk, neighbour, p.stage, p.chunk));
    }
    const auto before = [&](Op o) { return sn[static_cast<int>(o)] >= 0; };
    switch (a.op) {
      case Op::load_micro_batch:
        if (v != 0 && v != last)
          return fail(
              fmt::format("chunk {} holds virtual stage {}: only the first (inputs) and "
                          "the last (labels) virtual stage load data",
                          a.chunk, v));
        if (a.micro_batch <= last_load[a.chunk])
          return fail(
              fmt::format("loads micro-batch {} after micro-batch {}: loads run in "
                          "increasing order per chunk (one data iterator per role)",
                          a.micro_batch, last_load[a.chunk]));
        last_load[a.chunk] = a.micro_batch;
        break;
      case Op::forward:
        if (v > 0 && !before(Op::recv_activation))
          return fail(
              fmt::format("forward of {} before its input arrived: no recv_activation "
                          "earlier on this stage",
                          mb()));
        if ((v == 0 || v == last) && !before(Op::load_micro_batch))
          return fail(
              fmt::format("forward of {} on virtual stage {} before its load_micro_batch "
                          "(it needs the {})",
                          mb(), v, v == 0 ? "inputs" : "labels"));
        break;
      case Op::send_activation:
        if (!before(Op::forward))
          return fail(
              fmt::format("send_activation of {} before the forward that produces it", mb()));
        break;
      case Op::recv_grad:
        if (!before(Op::forward))
          return fail(
              fmt::format("recv_grad of {} before its forward: the slot holds no output "
                          "yet",
                          mb()));
        break;
      case Op::backward:
      case Op::backward_input: {
        if (!before(Op::forward))
          return fail(fmt::format("backward of {} before its forward", mb()));
        if (v < last && !before(Op::recv_grad))
          return fail(
              fmt::format("backward of {} before its output gradient arrived: no "
                          "recv_grad earlier on this stage",
                          mb()));
        const Op other = a.op == Op::backward ? Op::backward_input : Op::backward;
        if (before(other))
          return fail(
              fmt::format("{} of {} after a {}: use a full backward or the split pair "
                          "backward_input + backward_weight, not both",
                          op_name(a.op), mb(), op_name(other)));
        if (a.op == Op::backward) ++completed;
        break;
      }
      case Op::backward_weight:
        if (before(Op::backward))
          return fail(fmt::format("backward_weight of {} after its full backward", mb()));
        if (!before(Op::backward_input))
          return fail(fmt::format("backward_weight of {} before its backward_input", mb()));
        ++completed;
        break;
      case Op::send_grad:
        if (!before(Op::backward) && !before(Op::backward_input))
          return fail(fmt::format("send_grad of {} before the backward that computes it", mb()));
        break;
      default:
        break;
    }
    sn[op] = k;
  }
  if (s.training && step_at[2] < 0) {
    std::string missing;
    for (int idx = 0; idx < 3; ++idx)
      if (step_at[idx] < 0)
        missing += (missing.empty() ? "" : ", ") + std::string(op_name(kSteps[idx]));
    return ScheduleProblem{j,
                           -1,
                           fmt::format("a training schedule ends every stage with "
                                       "reduce_tied_grads, reduce_grads, optimizer_step; "
                                       "missing: {}",
                                       missing),
                           {}};
  }
  return std::nullopt;
}

}  // namespace pipetrain::schedule::detail
