// A range of layers with its skips, checkpointed or not (see the picture in skip_range.h).
#include "pipetrain/runtime/skip_range.h"

#include <memory>

#include "pipetrain/error.h"
#include "pipetrain/runtime/checkpoint.h"

namespace pipetrain::runtime {
namespace {

// Returns a tensor that is not the same object as any earlier output: an autograd function
// cannot return one tensor twice (the second would take over the first's place in the graph).
torch::Tensor distinct(const torch::Tensor& t, const Tensors& earlier) {
  for (const auto& e : earlier) {
    if (e.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return t.view_as(t);
  }
  return t;
}

void require_stashed(const skip::SkipTracker& tracker, const skip::SkipRoute& r) {
  if (!tracker.contains(r.key)) {
    throw ModuleError("layer " + std::to_string(r.stash_layer) + " declares the stash of skip " +
                      r.key.describe() + " (popped by layer " + std::to_string(r.pop_layer) +
                      ") but did not stash it; every declared stash must happen in each forward");
  }
}

torch::Tensor take_stashed(skip::SkipTracker& tracker, const skip::SkipRoute& r) {
  require_stashed(tracker, r);
  return tracker.pop(r.key);
}

}  // namespace

Batch run_with_skips(const skip::SkipPlan& plan, int64_t first, int64_t last, const Batch& input,
                     skip::SkipTracker& tracker, bool checkpoint, const RangeRunner& run) {
  const auto outs = plan.stashes_out(first, last);
  if (!checkpoint || !torch::GradMode::is_enabled()) {
    Batch out;
    {
      skip::TrackerScope scope(tracker);
      out = run(input);
    }
    for (const auto& r : outs) require_stashed(tracker, r);
    return out;
  }

  // An undefined skip tensor (an optional skip) does not enter the checkpoint: the inputs and
  // outputs of an autograd function are tensors. Which skips are present is recorded instead,
  // at forward, and the recomputation must find the same.
  const auto ins = plan.pops_in(first, last);
  Tensors inputs = input.tensors();
  const size_t n_in = inputs.size();
  std::vector<bool> in_present;
  for (const auto& r : ins) {
    torch::Tensor t = tracker.pop(r.key);
    in_present.push_back(t.defined());
    if (t.defined()) inputs.push_back(std::move(t));
  }

  struct Shape {
    bool atomic = true;
    size_t size = 0;
    bool recorded = false;
    std::vector<bool> out_present;  // per stashes_out route, at forward
  };
  auto shape = std::make_shared<Shape>();
  const bool atomic_in = input.atomic();
  // Runs again in backward: everything it uses is captured by value.
  auto fn = [ins, outs, n_in, in_present, atomic_in, shape, run](const Tensors& xs) -> Tensors {
    skip::SkipTracker local;
    size_t next = n_in;
    for (size_t k = 0; k < ins.size(); ++k) local.stash(ins[k].key, in_present[k] ? xs.at(next++) : torch::Tensor());
    Tensors head(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(n_in));
    Batch out;
    {
      skip::TrackerScope scope(local);
      out = run(atomic_in ? Batch(head.at(0)) : Batch::tuple(head));
    }
    Tensors result = out.tensors();
    std::vector<bool> present;
    for (const auto& r : outs) {
      torch::Tensor t = take_stashed(local, r);
      present.push_back(t.defined());
      if (t.defined()) result.push_back(distinct(t, result));
    }
    for (size_t k = 0; shape->recorded && k < outs.size(); ++k) {
      if (present[k] == shape->out_present[k]) continue;
      const auto what = [](bool defined) { return defined ? "a tensor" : "an undefined tensor"; };
      throw ModuleError("layer " + std::to_string(outs[k].stash_layer) + " stashed " + what(present[k]) +
                        " under skip " + outs[k].key.describe() + " when recomputed in backward but " +
                        what(shape->out_present[k]) +
                        " in its forward; whether an optional skip is stashed must depend only on the "
                        "layer's input (and on the random numbers it draws, which recomputation repeats)");
    }
    shape->atomic = out.atomic();
    shape->size = out.size();
    shape->out_present = std::move(present);
    shape->recorded = true;
    return result;
  };
  Tensors ys = checkpointed_forward(fn, inputs);
  size_t next = shape->size;
  for (size_t k = 0; k < outs.size(); ++k) {
    tracker.stash(outs[k].key, shape->out_present[k] ? ys.at(next++) : torch::Tensor());
  }
  ys.resize(shape->size);
  return shape->atomic && ys.size() == 1 ? Batch(ys[0]) : Batch::tuple(std::move(ys));
}

}  // namespace pipetrain::runtime
