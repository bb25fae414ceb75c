// Interpreting one stage's actions for one step.
#include "pipetrain/runtime/stage_executor.h"

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
        chunk(a).backward_weight(mbs);
        return j;
      }
      case Op::reduce_tied_grads:
      case Op::reduce_grads:
      case Op::optimizer_step:
        if (s_.on_step_op) s_.on_step_op(a.op, result_);
        return i + 1;
    }
    return i + 1;
  }

  void forward(const Action& a) {
    auto& st = state(a);
    if (!st.has_input) throw ScheduleError("forward ran before its input was loaded or received");
    torch::AutoGradMode grad_mode(s_.training);
    Batch out = chunk(a).forward(st.input, a.micro_batch);
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
    if (last(a)) {
      if (!st.loss.defined()) throw ScheduleError("backward ran before the loss of its forward");
      torch::autograd::backward({st.loss});
      st.loss = torch::Tensor();
    } else {
      if (!st.has_grad) throw ScheduleError("backward ran before its output gradient was received");
      std::vector<torch::Tensor> outs;
      for (const auto& t : st.output.tensors()) {
        if (needs_grad(t)) outs.push_back(t);
      }
      const auto& grads = st.grad.tensors();
      if (grads.size() != outs.size()) {
        throw BatchError("received " + std::to_string(grads.size()) + " gradient tensors for " +
                         std::to_string(outs.size()) + " differentiable outputs (" + st.output.describe() + ")");
      }
      if (!outs.empty()) torch::autograd::backward(outs, grads);
      st.grad = Batch();
      st.has_grad = false;
    }
    st.output = Batch();
    if (!first(a)) {
      std::vector<torch::Tensor> grads;
      for (const auto& t : st.input.tensors()) {
        if (!needs_grad(t)) continue;
        grads.push_back(t.grad().defined() ? t.grad() : torch::zeros_like(t));
      }
      st.input_grad = Batch::tuple(std::move(grads));
      st.has_input_grad = true;
    }
    st.input = Batch();
    st.has_input = false;
    if (a.op == Op::backward) chunk(a).backward_weight({a.micro_batch});
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
