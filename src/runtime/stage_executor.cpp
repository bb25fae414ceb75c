// Interpreting one stage's actions for one step.
#include "pipetrain/runtime/stage_executor.h"
#include "pipetrain/runtime/partitioned_transfer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

#include "pipetrain/error.h"
#include "pipetrain/runtime/device.h"
#include "pipetrain/runtime/rng.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/util/error_context.h"
#include "skip_traffic.h"

namespace pipetrain::runtime {

using detail::SkipTraffic;

namespace {

using detail::hand_over;
using detail::needs_grad;
using schedule::Action;
using schedule::Op;

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
        release_(schedule::slot_released_after(sched_, step.stage)),
        skips_(step) {
    if (step.keep_outputs) result_.outputs.resize(static_cast<size_t>(m_));
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
      record(i, next, filled_until_ >= 0 ? filled_until_ : t0, t1);
      filled_until_ = -1;
      for (size_t k = i; k < next; ++k) {
        if (release_[k]) release(actions_[k]);
      }
      i = next;
    }
    finish_weight_gradients();
    if (s_.channel) s_.channel->wait_sends();
    settle_losses();
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
    skips_.post_receives();
  }

  Batch receive(size_t i, const Action& a, Op kind) {
    if (a.peer_stage != s_.stage) {
      // The first receive of a training step is where a stage waits longest (pipeline fill):
      // build the backward's packed weights there instead of on the critical path.
      if (s_.training && !prepared_) {
        for (auto* c : s_.chunks) c->prepare_backward();
        prepared_ = true;
      }
      // Queued weight-gradient pieces fill the wait (their result does not depend on when
      // they run); each is short, so the message waits at most one piece.
      if (s_.training && !recvs_[i].ready()) fill_wait(recvs_[i]);
      return on_stage_device(assemble_received(recvs_[i].wait(), s_.tensor_parallel));
    }
    auto it = local_.find({kind, a.chunk, a.micro_batch});
    if (it == local_.end()) {
      throw ScheduleError("nothing was handed over on this stage before " + schedule::to_string(a));
    }
    Batch b = std::move(it->second);
    local_.erase(it);
    return b;
  }

  // A channel may deliver tensors on another device (ranks that are threads share one hub):
  // move them here as leaves, so the input gradient lands on the tensor the stage reads.
  Batch on_stage_device(const Batch& b) const {
    bool moved = false;
    std::vector<torch::Tensor> out;
    out.reserve(b.size());
    for (const auto& t : b.tensors()) {
      if (!t.defined() || t.device() == s_.device) {
        out.push_back(t);
        continue;
      }
      out.push_back(t.detach().to(s_.device).requires_grad_(t.requires_grad()));
      moved = true;
    }
    return moved ? b.with(std::move(out)) : b;
  }

  void send(const Action& a, const Batch& b, Op kind) {
    if (a.peer_stage == s_.stage) {
      local_[{kind, a.peer_chunk, a.micro_batch}] = hand_over(b);
      return;
    }
    const bool act = kind == Op::recv_activation;
    const Batch out = partition_for_send(b, s_.tensor_parallel);
    for (const auto& t : out.tensors()) {
      if (t.defined()) result_.bytes_sent += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
    }
    const auto stream = act ? comm::Stream::activation(a.peer_chunk) : comm::Stream::gradient(a.peer_chunk);
    s_.channel->isend(s_.rank_of_stage(a.peer_stage), stream, out, what(act ? "activation" : "gradient", a));
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
          st.input = copy_to((*s_.data)[a.micro_batch].inputs, s_.device);
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
        finish_weight_gradients();
        settle_losses();
        if (s_.on_step_op) s_.on_step_op(a.op, result_);
        return i + 1;
    }
    throw ScheduleError("stage " + std::to_string(s_.stage) + " has no handler for action " + schedule::to_string(a) +
                        " (op index " + std::to_string(static_cast<int>(a.op)) + ")");
  }

  // A group of weight gradients, placed by the list where the stage would wait for a gradient.
  // When that gradient arrives while the group runs, the group pauses (between two pieces of
  // the native accumulator, StageModel::backward_weight_group): the backward it feeds is on
  // the critical path of the stages before this one, W only fills time. What is left runs in
  // the stage's next waits for a message, or before the step actions:
  //
  //   list:  F7 [W0..W5]         RG6 I6 RG7          I7 [W6 W7]       O
  //   run:   F7 [W0..W5: part]   RG6 I6 RG7 (W0..W5) I7 [W6 W7, rest] O
  //
  // `next` is the position after the group: the receive whose arrival pauses it.
  void weight_gradients(int c, const std::vector<int64_t>& mbs, size_t next) {
    const bool can_pause = s_.training && next < actions_.size() && actions_[next].op == Op::recv_grad &&
                           actions_[next].peer_stage != s_.stage;
    std::function<bool()> arrived;
    if (can_pause) arrived = [this, next] { return recvs_[next].ready(); };
    if (s_.chunks.at(static_cast<size_t>(c))->backward_weight_group(mbs, arrived)) ++result_.weight_pauses;
  }

  void finish_weight_gradients() {
    for (auto* chunk : s_.chunks) chunk->finish_weight_groups();
  }

  bool fill_weight_gradients() {
    for (auto* chunk : s_.chunks) {
      if (chunk->fill_weight_gradients()) return true;
    }
    return false;
  }

  // The filling shows in the timeline as weight-gradient work of no micro-batch in particular
  // (schedule::estimate_costs spreads it over the step's W actions), and the receive starts
  // where it ended, so neither the bubble nor the transfer latency counts it as waiting.
  void fill_wait(comm::RecvHandle& recv) {
    const double begin = s_.clock();
    bool filled = false;
    while (!recv.ready() && fill_weight_gradients()) {
      filled = true;
      // Lets this process's communication threads, which receive the message, have the core.
      std::this_thread::yield();
    }
    if (!filled) return;
    filled_until_ = s_.clock();
    result_.events.push_back({s_.stage, Op::backward_weight, -1, 0, begin, filled_until_});
    result_.seconds[static_cast<size_t>(Op::backward_weight)] += filled_until_ - begin;
  }

  void forward(const Action& a) {
    auto& st = state(a);
    if (!st.has_input) throw ScheduleError("forward ran before its input was loaded or received");
    torch::AutoGradMode grad_mode(s_.training);
    st.skip_in.clear();
    for (const SkipLink* l : skips_.in_links(a.chunk)) {
      Batch b = skips_.receive(*l, a.micro_batch, false);
      if (b.size() != l->keys.size()) {
        throw BatchError("received " + std::to_string(b.size()) + " skip tensors on link " + std::to_string(l->id) +
                         " for " + std::to_string(l->keys.size()) + " keys");
      }
      for (size_t k = 0; k < b.size(); ++k) st.skips.stash(l->keys[k], b[k]);
      st.skip_in.push_back(std::move(b));
    }
    Batch out;
    {
      // Draws of torch::dropout, torch::rand, nested Dropouts: from this stage's stream alone,
      // so checkpoints recompute them and ranks sharing a process do not interleave (a chunk
      // seen to draw nothing runs free, concurrently with other ranks' threads).
      LearnedLease lease(chunk(a).draws(), s_.training, s_.rng_stream);
      out = chunk(a).forward(st.input, a.micro_batch, st.skips);
    }
    st.skip_out.clear();
    for (const SkipLink* l : skips_.out_links(a.chunk)) {
      std::vector<torch::Tensor> stashed;
      for (const auto& key : l->keys) stashed.push_back(st.skips.pop(key));
      Batch b = Batch::tuple_with_none(std::move(stashed));  // an optional skip travels as none
      skips_.send(*l, a.micro_batch, false, b);
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
    const Batch labels = copy_to((*s_.data)[a.micro_batch].labels, s_.device);
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
    // Summed where the loss is: reading each back would make the host wait for the device at
    // every micro-batch (settle_losses reads the sum once).
    const torch::Tensor value = loss.detach().reshape({}).to(torch::kDouble);
    loss_total_ = loss_total_.defined() ? loss_total_ + value : value;
    result_.losses += 1;
    if (s_.training) {
      // Backward starts in float32: a float16 loss times a scale of 2^16 would overflow.
      auto l = loss.reshape({});
      if (l.scalar_type() == torch::kHalf || l.scalar_type() == torch::kBFloat16) l = l.to(torch::kFloat);
      st.loss = l * (s_.loss_scale / static_cast<double>(m_));
    }
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
    // Stashed tensors that left for later parts get their gradients from there: one value per
    // key, none where the tensor needs no gradient (skip_grads).
    const auto& outs = skips_.out_links(a.chunk);
    for (size_t k = 0; k < outs.size() && k < st.skip_out.size(); ++k) {
      Batch g = skips_.receive(*outs[k], a.micro_batch, true);
      const auto& stashed = st.skip_out[k].tensors();
      if (g.size() != stashed.size()) {
        throw BatchError("received " + std::to_string(g.size()) + " skip gradients on link " +
                         std::to_string(outs[k]->id) + " for " + st.skip_out[k].describe());
      }
      for (size_t n = 0; n < stashed.size(); ++n) {
        if (!needs_grad(stashed[n])) continue;
        if (!g[n].defined()) {
          throw BatchError("skip gradient " + std::to_string(n) + " on link " + std::to_string(outs[k]->id) +
                           " is none but " + st.skip_out[k].describe() + " needs it");
        }
        roots.push_back(stashed[n]);
        grads.push_back(g[n]);
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
    const auto& ins = skips_.in_links(a.chunk);
    for (size_t k = 0; k < ins.size() && k < st.skip_in.size(); ++k) {
      skips_.send(*ins[k], a.micro_batch, true, Batch::tuple_with_none(skip_grads(st.skip_in[k])));
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

  // The gradients of a skip link's leaves, one per key: none where the value needs no gradient
  // (an undefined optional skip, a mask, a tensor that does not require grad). Never empty, as
  // a message must not be, even when nothing on the link is differentiable.
  static std::vector<torch::Tensor> skip_grads(const Batch& leaves) {
    std::vector<torch::Tensor> out;
    for (const auto& t : leaves.tensors()) {
      if (!needs_grad(t)) {
        out.emplace_back();
        continue;
      }
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
  SkipTraffic skips_;
  bool prepared_ = false;
  double filled_until_ = -1;  // where the current receive's wait began after filling it (-1: no filling)
  torch::Tensor loss_total_;  // the losses so far, on the loss's device
  StageStepResult result_;

  void settle_losses() {
    if (loss_total_.defined()) result_.loss_sum = loss_total_.item<double>();
  }
};

}  // namespace

StageStepResult run_stage_step(const StageStep& step) {
  if (!step.schedule || !step.clock) throw UsageError("run_stage_step needs a schedule and a clock");
  // An op outside the enum would index the per-op tables: refuse the list before any action runs.
  const auto& actions = step.schedule->stages.at(static_cast<size_t>(step.stage));
  for (size_t i = 0; i < actions.size(); ++i) {
    if (static_cast<int>(actions[i].op) >= schedule::kNumOps) {
      throw ScheduleError("stage " + std::to_string(step.stage) + ", action " + std::to_string(i) + " (" +
                          schedule::to_string(actions[i]) + "): unknown op index " +
                          std::to_string(static_cast<int>(actions[i].op)) + "; expected 0 to " +
                          std::to_string(schedule::kNumOps - 1) + " (build lists with the schedule generators or "
                          "parse_action, and validate custom ones)");
    }
  }
  if (static_cast<int>(step.chunks.size()) != step.schedule->num_chunks()) {
    throw UsageError("stage " + std::to_string(step.stage) + " has " + std::to_string(step.chunks.size()) +
                     " model chunks but the schedule has " + std::to_string(step.schedule->num_chunks()));
  }
  return Executor(step).run();
}

}  // namespace pipetrain::runtime
