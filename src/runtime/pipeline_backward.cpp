// The pipelined backward (see the picture in pipeline_backward.h).
#include "pipetrain/runtime/pipeline_backward.h"

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <mutex>

#include "pipetrain/batch/microbatch.h"
#include "pipetrain/error.h"
#include "pipetrain/runtime/device.h"

namespace pipetrain::runtime {
namespace {

using torch::autograd::variable_list;

// Where a partition's input gradient is captured: the task's backward runs into it and it
// keeps the gradient in its slot; nothing lies beyond it.
struct BoundaryNode : torch::autograd::Node {
  explicit BoundaryNode(GradSlot slot) : slot_(std::move(slot)) {}
  variable_list apply(variable_list&& grads) override {
    if (grads[0].defined()) *slot_ = slot_->defined() ? *slot_ + grads[0] : std::move(grads[0]);
    return {};
  }
  std::string name() const override { return "pipetrain::PartitionInput"; }

 private:
  GradSlot slot_;
};

bool has_graph(const torch::Tensor& t) { return t.defined() && t.requires_grad(); }

bool has_fast_path(const Stage& stage) {
  return std::any_of(stage.fast.begin(), stage.fast.end(), [](const auto& d) { return d != nullptr; });
}

// The state GPipeBackward keeps between the forward and its one backward.
struct BackwardState {
  BackwardState() = default;
  BackwardState(const BackwardState&) = delete;
  BackwardState& operator=(const BackwardState&) = delete;
  // What the fast-path Linear layers keep for this step's micro-batches goes with the step,
  // dropped on each partition's worker (the only thread that touches them).
  ~BackwardState() {
    if (!plan.workers || !graph) return;
    std::vector<int64_t> mbs;
    for (int64_t i = 0; i < graph->micro_batches(); ++i) mbs.push_back(plan.first_mb + i);
    for (size_t j = 0; j < plan.stages.size(); ++j) {
      if (!has_fast_path(plan.stages[j])) continue;
      auto fast = plan.stages[j].fast;
      plan.workers->submit<Batch>(static_cast<int64_t>(j), [fast, mbs] {
        for (const auto& d : fast) {
          if (d) d->discard(mbs);
        }
        return Batch();
      });
    }
  }
  std::shared_ptr<StepGraph> graph;
  BackwardPlan plan;
  std::vector<int64_t> input_positions;            // caller input positions with an edge
  std::vector<int64_t> output_positions;           // output positions with a gradient
  std::vector<std::vector<torch::Tensor>> input_grads;  // the caller's, by micro-batch and position
};

// The weight gradients of partition j's fast-path Linear layers for the step's micro-batches
// whose backward ran: one product per layer, after the partition's last backward task.
void accumulate_weight_gradients(BackwardState& s, int64_t j) {
  const int64_t first = s.plan.first_mb;
  const int64_t end = first + s.graph->micro_batches();
  for (const auto& d : s.plan.stages[static_cast<size_t>(j)].fast) {
    if (!d) continue;
    std::vector<int64_t> mbs;
    for (int64_t mb : d->pending()) {
      if (mb >= first && mb < end) mbs.push_back(mb);
    }
    d->backward_weight(mbs);
  }
}

// One B(i, j): back-propagates the task's local graph and routes the gradients its boundary
// nodes caught.
void backward_task(BackwardState& s, int64_t i, int64_t j, bool keep_graph) {
  TaskEnds& ends = s.graph->at(i, j);
  torch::autograd::edge_list roots;
  variable_list root_grads;
  auto add_root = [&](GraphEnd& end) {
    if (end.edge.is_valid() && end.grad.defined()) {
      roots.push_back(end.edge);
      root_grads.push_back(std::exchange(end.grad, torch::Tensor()));
    }
  };
  for (auto& out : ends.outputs) add_root(out);
  for (auto& skip : ends.stashed) add_root(skip.stashed);
  if (roots.empty()) return;  // nothing downstream used this micro-batch's outputs
  // Parameter gradients accumulate into .grad here, on the partition's worker: no other thread
  // touches this partition's parameters meanwhile (a checkpointed task's recomputation
  // accumulates the same way, from inside). The same call as torch::autograd::backward, from
  // the edges kept.
  torch::autograd::Engine::get_default_engine().execute(roots, root_grads, keep_graph, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true);

  for (size_t k = 0; k < ends.inputs.size(); ++k) {
    if (!ends.inputs[k]) continue;
    torch::Tensor grad = std::exchange(*ends.inputs[k], torch::Tensor());
    if (j == 0) {
      s.input_grads[static_cast<size_t>(i)][k] = std::move(grad);
    } else {
      TaskEnds& before = s.graph->at(i, j - 1);
      GraphEnd& out = before.outputs[k];
      if (grad.defined()) out.grad = grad.to(out.device);
    }
  }
  for (const auto& p : ends.popped) {
    if (!p.slot) continue;
    torch::Tensor grad = std::exchange(*p.slot, torch::Tensor());
    if (!grad.defined()) continue;
    const auto from = std::find_if(s.plan.stash_partition.begin(), s.plan.stash_partition.end(),
                                   [&](const auto& kv) { return kv.first == p.key; });
    TORCH_INTERNAL_ASSERT(from != s.plan.stash_partition.end(), "a popped skip with no stashing partition");
    for (auto& skip : s.graph->at(i, from->second).stashed) {
      if (skip.key == p.key) skip.stashed.grad = grad.to(skip.stashed.device);
    }
  }
}

class GPipeBackward : public torch::autograd::Node {
 public:
  explicit GPipeBackward(std::shared_ptr<BackwardState> state) : state_(std::move(state)) {}
  std::string name() const override { return "pipetrain::GPipeBackward"; }

  void release_variables() override { state_.reset(); }

  variable_list apply(variable_list&& grads) override {
    if (!state_) {
      throw UsageError(
          "Trying to backward through the graph a second time: GPipe's pipelined backward has freed the step's "
          "saved tensors. Specify retain_graph=True on the first backward to run it again");
    }
    if (torch::GradMode::is_enabled()) {
      throw UsageError(
          "GPipe's pipelined backward does not build a graph of the gradients (create_graph=True, higher-order "
          "gradients); compute them on the model run without the pipeline");
    }
    BackwardState& s = *state_;
    const bool keep_graph = torch::autograd::get_current_graph_task_keep_graph();
    if (keep_graph && std::any_of(s.plan.stages.begin(), s.plan.stages.end(), has_fast_path)) {
      throw UsageError(
          "GPipe's fast-path Linear layers keep their inputs for one backward, so a backward that keeps the "
          "graph (retain_graph=True) cannot run again; build the GPipe with GPipeOptions::deferred_linear(false) "
          "(Python: deferred_linear=False) to backward through one forward more than once");
    }
    const int64_t m = s.graph->micro_batches();
    const int64_t n = s.graph->partitions();

    // The caller's output gradient, by micro-batch, where the last partition's outputs are.
    for (size_t q = 0; q < s.output_positions.size(); ++q) {
      const auto k = static_cast<size_t>(s.output_positions[q]);
      const torch::Tensor& grad = grads[q];
      if (!grad.defined()) continue;
      int64_t row = 0;
      for (int64_t i = 0; i < m; ++i) {
        TaskEnds& last = s.graph->at(i, n - 1);
        GraphEnd& out = last.outputs[k];
        out.grad = grad.narrow(0, row, out.rows).to(out.device);
        row += out.rows;
      }
    }

    s.input_grads.assign(static_cast<size_t>(m), {});
    for (int64_t i = 0; i < m; ++i) s.input_grads[i].resize(s.plan.inputs[i].size());

    // The reverse of the forward's clock: B(m-1, n-1) first, B(0, 0) last.
    std::vector<Tick> ticks = clock_cycles(m, n);
    for (auto& tick : ticks) {
      for (auto& [i, j] : tick) {
        i = m - 1 - i;
        j = n - 1 - j;
      }
    }
    auto caller_state = std::make_shared<const at::ThreadLocalState>();
    // Each task owns the state with this node: one that hangs past its deadline (the pool is
    // then abandoned) finds it alive whenever it returns.
    auto make = [&](int64_t i, int64_t j) -> std::function<Batch()> {
      return [state = state_, caller_state, keep_graph, i, j] {
        at::ThreadLocalStateGuard tls(*caller_state);
        DeviceScope scope(state->plan.stages[static_cast<size_t>(j)].device);
        backward_task(*state, i, j, keep_graph);
        return Batch();
      };
    };
    // A partition's weight gradients start once its last backward task is done, beside the
    // backwards of the partitions before it.
    std::vector<std::pair<int64_t, TaskResult<Batch>>> weight_tasks;
    auto after = [&](int64_t i, int64_t j, Batch) {
      if (i != 0 || !has_fast_path(s.plan.stages[static_cast<size_t>(j)])) return;
      weight_tasks.emplace_back(j, s.plan.workers->submit<Batch>(j, [state = state_, j] {
        const auto from = std::chrono::steady_clock::now();
        accumulate_weight_gradients(*state, j);
        if (state->plan.timeline) {
          state->plan.timeline->record(j, schedule::Op::backward_weight, -1, from, std::chrono::steady_clock::now());
        }
        return Batch();
      }));
    };
    std::exception_ptr failure;
    try {
      if (s.plan.timeline) s.plan.timeline->backward_starts();
      run_ticks(ticks, *s.plan.workers, s.plan.task_timeout_s, "backward", make, after, s.plan.timeline,
                schedule::Op::backward);
    } catch (...) {
      failure = std::current_exception();
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(s.plan.task_timeout_s));
    for (auto& [j, task] : weight_tasks) {
      if (!task.wait_until(deadline)) {
        s.plan.workers->abandon();
        throw TimeoutError(fmt::format("GPipe: partition {} did not finish its weight gradients within {} s "
                                       "(GPipeOptions::task_timeout)", j, s.plan.task_timeout_s));
      }
      try {
        task.get();
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) {
      if (!s.plan.workers->abandoned()) {  // every task is done: the kept tensors can go
        for (const auto& stage : s.plan.stages) {
          for (const auto& d : stage.fast) {
            if (d) d->clear();
          }
        }
      }
      std::rethrow_exception(failure);
    }

    variable_list result;
    for (const auto k : s.input_positions) {
      std::vector<torch::Tensor> parts;
      bool any = false;
      for (int64_t i = 0; i < m; ++i) {
        const torch::Tensor& piece = s.plan.inputs[i][static_cast<size_t>(k)];
        torch::Tensor grad = s.input_grads[i][static_cast<size_t>(k)];
        any = any || grad.defined();
        parts.push_back(grad.defined() ? grad.to(piece.device()) : torch::zeros_like(piece));
      }
      result.push_back(any ? torch::cat(parts) : torch::Tensor());
    }
    return result;
  }

 private:
  std::shared_ptr<BackwardState> state_;
};

}  // namespace

GraphEnd GraphEnd::of(const torch::Tensor& tensor) {
  GraphEnd end;
  if (!tensor.defined()) return end;
  if (tensor.requires_grad()) end.edge = torch::autograd::impl::gradient_edge(tensor);
  end.device = tensor.device();
  end.rows = tensor.dim() > 0 ? tensor.size(0) : 0;
  return end;
}

StepGraph::StepGraph(int64_t micro_batches, int64_t partitions)
    : micro_batches_(micro_batches),
      partitions_(partitions),
      tasks_(static_cast<size_t>(micro_batches * partitions)) {}

torch::Tensor enter_partition(const torch::Tensor& value, GradSlot& slot) {
  slot.reset();
  if (!has_graph(value)) return value;
  slot = std::make_shared<torch::Tensor>();
  torch::Tensor entered = value.detach();
  torch::autograd::set_history(entered, std::make_shared<BoundaryNode>(slot));
  return entered;
}

Batch enter_partition(const Batch& value, std::vector<GradSlot>& slots) {
  std::vector<torch::Tensor> entered;
  slots.assign(value.size(), nullptr);
  for (size_t k = 0; k < value.size(); ++k) entered.push_back(enter_partition(value[k], slots[k]));
  return value.with(std::move(entered));
}

Batch attach_pipelined_backward(std::shared_ptr<StepGraph> graph, BackwardPlan plan,
                                const std::vector<Batch>& outputs) {
  auto state = std::make_shared<BackwardState>();
  Batch gathered;
  {
    torch::NoGradGuard no_grad;  // values only: the graph behind them is GPipeBackward
    gathered = gather(outputs);
  }
  std::vector<torch::Tensor> values = gathered.tensors();
  torch::autograd::variable_list edges_from;  // the caller's inputs, in apply's result order
  const auto& caller = plan.caller_input.tensors();
  for (size_t k = 0; k < caller.size(); ++k) {
    if (has_graph(caller[k])) {
      state->input_positions.push_back(static_cast<int64_t>(k));
      edges_from.push_back(caller[k]);
    }
  }
  auto node = std::shared_ptr<GPipeBackward>(new GPipeBackward(state), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(edges_from));
  for (size_t k = 0; k < values.size(); ++k) {
    const bool differentiable = std::any_of(outputs.begin(), outputs.end(), [&](const Batch& b) {
      return has_graph(b.tensors()[k]);
    });
    if (!differentiable) continue;
    // A fresh tensor (a lone micro-batch's output is gathered as itself, and its own graph
    // must stay the task's).
    torch::Tensor out = values[k].detach();
    torch::autograd::set_history(out, node);
    values[k] = out;
    state->output_positions.push_back(static_cast<int64_t>(k));
  }
  state->graph = std::move(graph);
  state->plan = std::move(plan);
  return gathered.with(std::move(values));
}

}  // namespace pipetrain::runtime
