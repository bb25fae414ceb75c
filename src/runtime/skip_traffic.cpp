// A stage's skip-link traffic for one step: receives posted early, sends, hand-overs.
#include "skip_traffic.h"

#include "pipetrain/error.h"

namespace pipetrain::runtime::detail {

using schedule::Action;
using schedule::Op;

bool needs_grad(const torch::Tensor& t) { return t.defined() && t.is_floating_point() && t.requires_grad(); }

Batch hand_over(const Batch& b) {
  std::vector<torch::Tensor> out;
  for (const auto& t : b.tensors()) {
    if (!t.defined()) {  // none on a skip link (an optional skip) is handed over as none
      out.emplace_back();
      continue;
    }
    auto d = t.detach();
    if (needs_grad(t)) d.requires_grad_(true);
    out.push_back(d);
  }
  return b.with(std::move(out));
}

namespace {

std::string describe(bool grad, const SkipLink& l, int mb) {
  return std::string(grad ? "skip gradients" : "skip tensors") + " of micro-batch " + std::to_string(mb) + " (link " +
         std::to_string(l.id) + ": part " + std::to_string(l.src_virtual) + " -> " + std::to_string(l.dst_virtual) +
         ")";
}

}  // namespace

SkipTraffic::SkipTraffic(const StageStep& step)
    : s_(step),
      in_(static_cast<size_t>(step.schedule->num_chunks())),
      out_(static_cast<size_t>(step.schedule->num_chunks())) {
  if (!step.skip_links) return;
  const auto& layout = step.schedule->layout;
  for (const auto& l : *step.skip_links) {
    const auto dst = layout.placement(l.dst_virtual);
    const auto src = layout.placement(l.src_virtual);
    if (dst.stage == step.stage) in_[static_cast<size_t>(dst.chunk)].push_back(&l);
    if (src.stage == step.stage) out_[static_cast<size_t>(src.chunk)].push_back(&l);
  }
}

void SkipTraffic::post_receives() {
  const auto& sched = *s_.schedule;
  // Links ending here: tensors, in the order the stashing chunk runs its forwards.
  for (const auto& links : in_) {
    for (const SkipLink* l : links) {
      const auto src = sched.layout.placement(l->src_virtual);
      if (src.stage == s_.stage) continue;
      for (const Action& a : sched.stages.at(src.stage)) {
        if (a.op != Op::forward || a.chunk != src.chunk) continue;
        posted_[{l->id, a.micro_batch, false}] = s_.channel->irecv(
            s_.rank_of_stage(src.stage), comm::Stream::skip_activation(l->id), describe(false, *l, a.micro_batch));
      }
    }
  }
  if (!s_.training) return;
  // Links starting here: gradients, in the order the popping chunk runs its backwards.
  for (const auto& links : out_) {
    for (const SkipLink* l : links) {
      const auto dst = sched.layout.placement(l->dst_virtual);
      if (dst.stage == s_.stage) continue;
      for (const Action& a : sched.stages.at(dst.stage)) {
        if ((a.op != Op::backward && a.op != Op::backward_input) || a.chunk != dst.chunk) continue;
        posted_[{l->id, a.micro_batch, true}] = s_.channel->irecv(
            s_.rank_of_stage(dst.stage), comm::Stream::skip_gradient(l->id), describe(true, *l, a.micro_batch));
      }
    }
  }
}

Batch SkipTraffic::receive(const SkipLink& l, int mb, bool grad) {
  const Key key{l.id, mb, grad};
  const auto from = s_.schedule->layout.placement(grad ? l.dst_virtual : l.src_virtual);
  if (from.stage == s_.stage) {
    auto it = local_.find(key);
    if (it == local_.end()) throw ScheduleError("nothing was handed over for the " + describe(grad, l, mb));
    Batch b = std::move(it->second);
    local_.erase(it);
    return b;
  }
  auto it = posted_.find(key);
  if (it == posted_.end()) {
    throw ScheduleError("no receive of the " + describe(grad, l, mb) + " was posted on stage " +
                        std::to_string(s_.stage));
  }
  Batch b = it->second.wait();
  posted_.erase(it);
  return b;
}

void SkipTraffic::send(const SkipLink& l, int mb, bool grad, const Batch& b) {
  const auto to = s_.schedule->layout.placement(grad ? l.src_virtual : l.dst_virtual);
  if (to.stage == s_.stage) {
    local_[{l.id, mb, grad}] = hand_over(b);
    return;
  }
  const auto stream = grad ? comm::Stream::skip_gradient(l.id) : comm::Stream::skip_activation(l.id);
  s_.channel->isend(s_.rank_of_stage(to.stage), stream, b, describe(grad, l, mb));
}

}  // namespace pipetrain::runtime::detail
