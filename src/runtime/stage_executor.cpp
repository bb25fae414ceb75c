// Interpreting one stage's actions for one step.
#include "pipetrain/runtime/stage_executor.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "pipetrain/error.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/util/error_context.h"

namespace pipetrain::runtime {

namespace {

using schedule::Action;
using schedule::Op;

bool needs_grad(const torch::Tensor& t) {
  return t.defined() && t.is_floating_point() && t.requires_grad();
}

// What crosses to the next chunk on the same stage (ZB-V's turn): a fresh leaf, as if it had
// travelled through a channel.
Batch hand_over(const Batch& b) {
  std::vector<torch::Tensor> out;
  for (const auto& t : b.tensors()) {
    auto d = t.detach();
    if (needs_grad(t)) d.requires_grad_(true);
    out.push_back(d);
  }
  return b.with(std::move(out));
}

struct MicroState {
  Batch input;        // the chunk's input (leaves where they need a gradient)
  Batch output;       // its output, carrying the graph until backward
  torch::Tensor loss;  // scaled loss where the chunk is the last virtual stage
  Batch grad;         // gradient of the output's differentiable tensors, received
  Batch input_grad;   // gradient of the input's differentiable tensors, to send
  skip::SkipTracker skips;           // popped tensors going in, stashed ones coming out
  std::vector<Batch> skip_in;        // per incoming link: the received leaves
  std::vector<Batch> skip_out;       // per outgoing link: the stashed tensors sent
  bool has_input = false;
  bool has_grad = false;
  bool has_input_grad = false;
};

class Executor {
 public:
  explicit Executor(const StageStep& step)
      : s_(step),
        sched_(*step.schedule),
        actions_(sched_.stages.at(step.stage)),
        m_(sched_.num_micro_batches),
        states_(static_cast<size_t>(sched_.num_chunks() * m_)),
        release_(schedule::slot_released_after(sched_, step.stage)) {
    if (step.keep_outputs) result_.outputs.resize(static_cast<size_t>(m_));
    in_links_.resize(static_cast<size_t>(sched_.num_chunks()));
    out_links_.resize(static_cast<size_t>(sched_.num_chunks()));
    if (!step.skip_links) return;
    for (const auto& l : *step.skip_links) {
      const auto dst = sched_.layout.placement(l.dst_virtual);
      const auto src = sched_.layout.placement(l.src_virtual);
      if (dst.stage == step.stage) in_links_[static_cast<size_t>(dst.chunk)].push_back(&l);
      if (src.stage == step.stage) out_links_[static_cast<size_t>(src.chunk)].push_back(&l);
    }
  }

  StageStepResult run() {
    post_receives();
    for (size_t i = 0; i < actions_.size();) {
      const Action& a = actions_[i];
      const double t0 = s_.clock();
      size_t next = i + 1;
      try {
        next = execute(i);
      } catch (...) {
        for (auto* chunk : s_.chunks) chunk->clear();
        util::rethrow_with_context("stage " + std::to_string(s_.stage) + ", action " +
                                   schedule::to_string(a));
      }
      const double t1 = s_.clock();
      record(i, next, t0, t1);
      for (size_t k = i; k < next; ++k) {
        if (release_[k]) release(actions_[k]);
      }
      i = next;
    }
    finish_paused_weight_gradients();
    if (s_.channel) s_.channel->wait_sends();
    return std::move(result_);
  }

 private:
  MicroState& state(const Action& a) { return states_.at(static_cast<size_t>(a.chunk * m_ + a.micro_batch)); }
  StageModel& chunk(const Action& a) { return *s_.chunks.at(static_cast<size_t>(a.chunk)); }
  bool first(const Action& a) const { return sched_.layout.is_first(s_.stage, a.chunk); }
  bool last(const Action& a) const { return sched_.layout.is_last(s_.stage, a.chunk); }
  static std::string what(const char* kind, const Action& a) {
    return std::string(kind) + " of micro-batch " + std::to_string(a.micro_batch);
  }

  void post_receives() {
    recvs_.resize(actions_.size());
    for (size_t i = 0; i < actions_.size(); ++i) {
      const Action& a = actions_[i];
      if (!schedule::is_recv(a.op) || a.peer_stage == s_.stage) continue;
      const bool act = a.op == Op::recv_activation;
      const auto stream = act ? comm::Stream::activation(a.chunk) : comm::Stream::gradient(a.chunk);
      recvs_[i] = s_.channel->irecv(s_.rank_of_stage(a.peer_stage), stream,
                                    what(act ? "activation" : "gradient", a));
    }
    post_skip_receives();
  }

  // Each link's receives in the order its sender sends: the stashing chunk's forwards, the
  // popping chunk's backwards (B or I).
  void post_skip_receives() {
    for (size_t c = 0; c < in_links_.size(); ++c) {
      for (const SkipLink* l : in_links_[c]) {
        const auto src = sched_.layout.placement(l->src_virtual);
        if (src.stage == s_.stage) continue;
        for (const Action& a : sched_.stages.at(src.stage)) {
          if (a.op != Op::forward || a.chunk != src.chunk) continue;
          skip_recvs_[{l->id, a.micro_batch, 0}] = s_.channel->irecv(
              s_.rank_of_stage(src.stage), comm::Stream::skip_activation(l->id), skip_what("skip tensors", *l, a));
        }
      }
    }
    if (!s_.training) return;
    for (size_t c = 0; c < out_links_.size(); ++c) {
      for (const SkipLink* l : out_links_[c]) {
        const auto dst = sched_.layout.placement(l->dst_virtual);
        if (dst.stage == s_.stage) continue;
        for (const Action& a : sched_.stages.at(dst.stage)) {
          if ((a.op != Op::backward && a.op != Op::backward_input) || a.chunk != dst.chunk) continue;
          skip_recvs_[{l->id, a.micro_batch, 1}] = s_.channel->irecv(
              s_.rank_of_stage(dst.stage), comm::Stream::skip_gradient(l->id), skip_what("skip gradients", *l, a));
        }
      }
    }
  }

  static std::string skip_what(const char* kind, const SkipLink& l, const Action& a) {
    return std::string(kind) + " of micro-batch " + std::to_string(a.micro_batch) + " (link " +
           std::to_string(l.id) + ": part " + std::to_string(l.src_virtual) + " -> " +
           std::to_string(l.dst_virtual) + ")";
  }

  // The message of link `l` for micro-batch `mb`: skip tensors (grad = 0) or their gradients.
  Batch receive_skip(const SkipLink& l, int mb, int grad) {
    const std::tuple<int, int, int> key{l.id, mb, grad};
    if (sched_.layout.placement(grad ? l.dst_virtual : l.src_virtual).stage == s_.stage) {
      auto it = local_skips_.find(key);
      if (it == local_skips_.end()) {
        throw ScheduleError(std::string("nothing was handed over for the ") + (grad ? "skip gradients" : "skip tensors") +
                            " of link " + std::to_string(l.id) + ", micro-batch " + std::to_string(mb));
      }
      Batch b = std::move(it->second);
      local_skips_.erase(it);
      return b;
    }
    auto it = skip_recvs_.find(key);
    if (it == skip_recvs_.end()) {
      throw ScheduleError(std::string("no receive of the ") + (grad ? "skip gradients" : "skip tensors") + " of link " +
                          std::to_string(l.id) + ", micro-batch " + std::to_string(mb) + " was posted on stage " +
                          std::to_string(s_.stage));
    }
    Batch b = it->second.wait();
    skip_recvs_.erase(it);
    return b;
  }

  void send_skip(const SkipLink& l, int mb, int grad, const Batch& b) {
    const auto to = sched_.layout.placement(grad ? l.src_virtual : l.dst_virtual);
    if (to.stage == s_.stage) {
      local_skips_[{l.id, mb, grad}] = hand_over(b);
      return;
    }
    const auto stream = grad ? comm::Stream::skip_gradient(l.id) : comm::Stream::skip_activation(l.id);
    s_.channel->isend(s_.rank_of_stage(to.stage), stream, b,
                      std::string(grad ? "skip gradients" : "skip tensors") + " of micro-batch " + std::to_string(mb) +
                          " (link " + std::to_string(l.id) + ")");
  }

  Batch receive(size_t i, const Action& a, Op kind) {
    if (a.peer_stage != s_.stage) {
      // The first receive of a training step is where a stage waits longest (pipeline fill):
      // build the backward's packed weights there instead of on the critical path.
      if (s_.training && !prepared_) {
        for (auto* c : s_.chunks) c->prepare_backward();
        prepared_ = true;
      }
      return recvs_[i].wait();
    }
    auto it = local_.find({kind, a.chunk, a.micro_batch});
    if (it == local_.end()) {
      throw ScheduleError("nothing was handed over on this stage before " + schedule::to_string(a));
    }
    Batch b = std::move(it->second);
    local_.erase(it);
    return b;
  }

  void send(const Action& a, const Batch& b, Op kind) {
    if (a.peer_stage == s_.stage) {
      local_[{kind, a.peer_chunk, a.micro_batch}] = hand_over(b);
      return;
    }
    const bool act = kind == Op::recv_activation;
    const auto stream = act ? comm::Stream::activation(a.peer_chunk) : comm::Stream::gradient(a.peer_chunk);
    s_.channel->isend(s_.rank_of_stage(a.peer_stage), stream, b, what(act ? "activation" : "gradient", a));
  }

  size_t execute(size_t i) {
    const Action& a = actions_[i];
    switch (a.op) {
      case Op::load_micro_batch: {
        if (!s_.data || a.micro_batch >= static_cast<int>(s_.data->size())) {
          throw DataError("micro-batch " + std::to_string(a.micro_batch) + " was not loaded on stage " +
                          std::to_string(s_.stage));
        }
        if (first(a)) {
          auto& st = state(a);
          st.input = (*s_.data)[a.micro_batch].inputs;
          st.has_input = true;
        }
        return i + 1;
      }
      case Op::recv_activation: {
        auto& st = state(a);
        st.input = receive(i, a, Op::recv_activation);
        st.has_input = true;
        return i + 1;
      }
      case Op::forward:
        forward(a);
        return i + 1;
      case Op::send_activation:
        send(a, state(a).output, Op::recv_activation);
        if (!s_.training) state(a).output = Batch();
        return i + 1;
      case Op::recv_grad: {
        auto& st = state(a);
        st.grad = receive(i, a, Op::recv_grad);
        st.has_grad = true;
        return i + 1;
      }
      case Op::backward:
      case Op::backward_input:
        backward(a);
        return i + 1;
      case Op::send_grad: {
        auto& st = state(a);
        if (!st.has_input_grad) throw ScheduleError("gradient sent before its backward ran");
        send(a, st.input_grad, Op::recv_grad);
        st.input_grad = Batch();
        st.has_input_grad = false;
        return i + 1;
      }
      case Op::backward_weight: {
        // Consecutive weight-gradient actions of one chunk run as one fused product.
        std::vector<int64_t> mbs;
        size_t j = i;
        while (j < actions_.size() && actions_[j].op == Op::backward_weight && actions_[j].chunk == a.chunk) {
          mbs.push_back(actions_[j].micro_batch);
          ++j;
        }
        weight_gradients(a.chunk, mbs, j);
        return j;
      }
      case Op::reduce_tied_grads:
      case Op::reduce_grads:
      case Op::optimizer_step:
        finish_paused_weight_gradients();
        if (s_.on_step_op) s_.on_step_op(a.op, result_);
        return i + 1;
    }
    return i + 1;
  }

  // A group of weight gradients, placed by the list where the stage would wait for a gradient.
  // When that gradient arrives while the group runs, the group pauses between two layers
  // (StageModel::backward_weight_group): the backward it feeds is on the critical path of the
  // stages before this one, W only fills time. The paused layers join the chunk's next group
  // or run before the step actions:
  //
  //   list:  F7 [W0..W5]            RG6 I6 RG7 I7 [W6 W7]                             O
  //   run:   F7 [W0..W5: layer 0]   RG6 I6 RG7 I7 [W6 W7: layer 0, W0..W7: layers 1..]  O
  //
  // `next` is the position after the group: the receive whose arrival pauses it.
  void weight_gradients(int c, const std::vector<int64_t>& mbs, size_t next) {
    const bool can_pause = s_.training && next < actions_.size() && actions_[next].op == Op::recv_grad &&
                           actions_[next].peer_stage != s_.stage;
    std::function<bool()> arrived;
    if (can_pause) arrived = [this, next] { return recvs_[next].ready(); };
    if (s_.chunks.at(static_cast<size_t>(c))->backward_weight_group(mbs, arrived)) ++result_.weight_pauses;
  }

  void finish_paused_weight_gradients() {
    for (auto* chunk : s_.chunks) chunk->finish_weight_groups();
  }

  void forward(const Action& a) {
    auto& st = state(a);
    if (!st.has_input) throw ScheduleError("forward ran before its input was loaded or received");
    torch::AutoGradMode grad_mode(s_.training);
    const auto& ins = in_links_[static_cast<size_t>(a.chunk)];
    st.skip_in.clear();
    for (const SkipLink* l : ins) {
      Batch b = receive_skip(*l, a.micro_batch, 0);
      if (b.size() != l->keys.size()) {
        throw BatchError("received " + std::to_string(b.size()) + " skip tensors on link " + std::to_string(l->id) +
                         " for " + std::to_string(l->keys.size()) + " keys");
      }
      for (size_t k = 0; k < b.size(); ++k) st.skips.stash(l->keys[k], b[k]);
      st.skip_in.push_back(std::move(b));
    }
    Batch out = chunk(a).forward(st.input, a.micro_batch, st.skips);
    st.skip_out.clear();
    for (const SkipLink* l : out_links_[static_cast<size_t>(a.chunk)]) {
      std::vector<torch::Tensor> stashed;
      for (const auto& key : l->keys) stashed.push_back(st.skips.pop(key));
      Batch b = Batch::tuple(std::move(stashed));
      send_skip(*l, a.micro_batch, 0, b);
      if (s_.training) st.skip_out.push_back(std::move(b));
    }
    if (!s_.training) st.skip_in.clear();
    if (!last(a)) {
      st.output = std::move(out);
      return;
    }
    if (!s_.data || a.micro_batch >= static_cast<int>(s_.data->size())) {
      throw DataError("labels of micro-batch " + std::to_string(a.micro_batch) + " were not loaded");
    }
    if (s_.keep_outputs) {
      std::vector<torch::Tensor> detached;
      for (const auto& t : out.tensors()) detached.push_back(t.detach());
      result_.outputs[a.micro_batch] = out.with(std::move(detached));
    }
    if (!s_.loss) return;
    const Batch& labels = (*s_.data)[a.micro_batch].labels;
    torch::Tensor loss;
    try {
      loss = s_.loss(out, labels);
    } catch (const c10::Error& e) {
      // Most often labels that do not fit the model's output: say which shapes met.
      std::string shapes;
      for (const auto& t : out.tensors()) shapes += (shapes.empty() ? "" : ", ") + c10::str(t.sizes());
      std::string label_shapes;
      for (const auto& t : labels.tensors()) label_shapes += (label_shapes.empty() ? "" : ", ") + c10::str(t.sizes());
      throw BatchError("the loss of micro-batch " + std::to_string(a.micro_batch) + " failed on output " + shapes +
                       " and labels " + label_shapes + ": " + e.what_without_backtrace());
    }
    if (!loss.defined() || loss.numel() != 1) {
      throw BatchError("the loss function must return a scalar, got " +
                       (loss.defined() ? c10::str(loss.sizes()) : std::string("an undefined tensor")));
    }
    result_.loss_sum += loss.detach().item<double>();
    result_.losses += 1;
    if (s_.training) st.loss = loss.reshape({}) / static_cast<double>(m_);
  }

  void backward(const Action& a) {
    auto& st = state(a);
    std::vector<torch::Tensor> roots, grads;
    if (last(a)) {
      if (!st.loss.defined()) throw ScheduleError("backward ran before the loss of its forward");
      roots.push_back(st.loss);
      grads.emplace_back();
      st.loss = torch::Tensor();
    } else {
      if (!st.has_grad) throw ScheduleError("backward ran before its output gradient was received");
      for (const auto& t : st.output.tensors()) {
        if (needs_grad(t)) roots.push_back(t);
      }
      grads = st.grad.tensors();
      if (grads.size() != roots.size()) {
        throw BatchError("received " + std::to_string(grads.size()) + " gradient tensors for " +
                         std::to_string(roots.size()) + " differentiable outputs (" + st.output.describe() + ")");
      }
      st.grad = Batch();
      st.has_grad = false;
    }
    // Stashed tensors that left for later parts get their gradients from there.
    const auto& outs = out_links_[static_cast<size_t>(a.chunk)];
    for (size_t k = 0; k < outs.size() && k < st.skip_out.size(); ++k) {
      Batch g = receive_skip(*outs[k], a.micro_batch, 1);
      const auto& stashed = st.skip_out[k].tensors();
      if (g.size() != static_cast<size_t>(std::count_if(stashed.begin(), stashed.end(), needs_grad))) {
        throw BatchError("received " + std::to_string(g.size()) + " skip gradients on link " +
                         std::to_string(outs[k]->id) + " for " + st.skip_out[k].describe());
      }
      size_t n = 0;
      for (const auto& t : stashed) {
        if (!needs_grad(t)) continue;
        roots.push_back(t);
        grads.push_back(g[n++]);
      }
    }
    if (!roots.empty()) {
      if (roots.size() == 1 && !grads[0].defined()) {
        torch::autograd::backward(roots);
      } else {
        if (!grads[0].defined()) grads[0] = torch::ones_like(roots[0]);
        torch::autograd::backward(roots, grads);
      }
    }
    st.output = Batch();
    st.skip_out.clear();
    if (!first(a)) {
      st.input_grad = Batch::tuple(leaf_grads(st.input));
      st.has_input_grad = true;
    }
    const auto& ins = in_links_[static_cast<size_t>(a.chunk)];
    for (size_t k = 0; k < ins.size() && k < st.skip_in.size(); ++k) {
      send_skip(*ins[k], a.micro_batch, 1, Batch::tuple(leaf_grads(st.skip_in[k])));
    }
    st.skip_in.clear();
    st.input = Batch();
    st.has_input = false;
    if (a.op == Op::backward) chunk(a).backward_weight({a.micro_batch});
  }

  // The gradients of a batch's differentiable leaves (zeros where nothing flowed back).
  static std::vector<torch::Tensor> leaf_grads(const Batch& leaves) {
    std::vector<torch::Tensor> out;
    for (const auto& t : leaves.tensors()) {
      if (!needs_grad(t)) continue;
      out.push_back(t.grad().defined() ? t.grad() : torch::zeros_like(t));
    }
    return out;
  }

  void release(const Action& a) {
    if (!schedule::has_micro_batch(a.op)) return;
    auto& st = state(a);
    if (!st.has_input_grad) st = MicroState();
  }

  void record(size_t begin, size_t end, double t0, double t1) {
    // A fused run of weight gradients shows as equal parts, one per micro-batch.
    const double part = (t1 - t0) / static_cast<double>(end - begin);
    for (size_t k = begin; k < end; ++k) {
      const Action& a = actions_[k];
      const double start = t0 + part * static_cast<double>(k - begin);
      result_.events.push_back({s_.stage, a.op, a.micro_batch, a.chunk, start, start + part});
      result_.seconds[static_cast<size_t>(a.op)] += part;
    }
  }

  const StageStep& s_;
  const schedule::Schedule& sched_;
  const std::vector<Action>& actions_;
  int m_;
  std::vector<MicroState> states_;
  std::vector<bool> release_;
  std::vector<comm::RecvHandle> recvs_;
  std::map<std::tuple<Op, int, int>, Batch> local_;
  // Skip links of each local chunk, and their messages by (link, micro-batch, 0 = tensors /
  // 1 = gradients): posted receives, and hand-overs between chunks of this stage.
  std::vector<std::vector<const SkipLink*>> in_links_, out_links_;
  std::map<std::tuple<int, int, int>, comm::RecvHandle> skip_recvs_;
  std::map<std::tuple<int, int, int>, Batch> local_skips_;
  bool prepared_ = false;
  StageStepResult result_;
};

}  // namespace

StageStepResult run_stage_step(const StageStep& step) {
  if (!step.schedule || !step.clock) throw UsageError("run_stage_step needs a schedule and a clock");
  if (static_cast<int>(step.chunks.size()) != step.schedule->num_chunks()) {
    throw UsageError("stage " + std::to_string(step.stage) + " has " + std::to_string(step.chunks.size()) +
                     " model chunks but the schedule has " + std::to_string(step.schedule->num_chunks()));
  }
  return Executor(step).run();
}

}  // namespace pipetrain::runtime
