// The pipelined backward of the single-process pipeline (runtime/pipeline.h).
//
// In training, each task (micro-batch i through partition j) builds a graph of its own: the
// partition's inputs enter through boundary nodes (autograd nodes with no next edges, so
// autograd never walks from one partition into another) and its outputs end the local graph.
// The gathered output hangs from one node, GPipeBackward, whose next edges are the caller's
// input tensors. When autograd reaches it (loss.backward() on the caller's
// thread), it runs the backward half as a pipeline of its own, tick by tick, on the partitions'
// workers, in the reverse of the forward's clock:
//
//          worker 0            worker 1                 (m = 2 micro-batches, n = 2 partitions)
//   k=0                        B(1,1)
//   k=1    B(1,0)      ║       B(0,1)                   concurrent
//   k=2    B(0,0)
//
// B(i, j) back-propagates micro-batch i through partition j's local graph from the gradients
// of its outputs (the next partition's input gradients, or the caller's output gradient) and of
// the skips it stashed for later partitions; its boundary nodes keep the gradients that reach
// them, for the partitions before, and the parameters' gradients accumulate into .grad on the
// partition's worker (as a checkpoint's recomputation accumulates them: the parameters are not
// edges of GPipeBackward, so torch::autograd::grad with respect to them finds no path). On the
// CPU, where LibTorch's autograd has one thread, this is what pipelines the backward.
//
// A boundary node is a gradient's capture point, not a leaf: a layer may still modify its
// input in place. Checkpointed tasks recompute on their partition's worker. Fast-path Linear
// layers (runtime/deferred_linear.h) compute only input gradients in B(i, j); their weight
// gradients for the whole step are one product each after B(0, j), the partition's last task,
// while the partitions before it still run their backwards. Their kept tensors are retained
// per step only, so a backward that keeps the graph (retain_graph) is refused where a
// partition has them (GPipeOptions::deferred_linear(false) allows it); a step dropped without
// a backward has them dropped on the workers.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "pipetrain/batch/batch.h"
#include "pipetrain/runtime/pipeline.h"
#include "pipetrain/runtime/worker.h"
#include "pipetrain/skip/skippable.h"

namespace pipetrain::runtime {

// Where a boundary node keeps the gradient that reached it.
using GradSlot = std::shared_ptr<torch::Tensor>;

// Where a gradient enters a task's graph: a tensor's place in autograd, kept instead of the
// tensor, so that nothing the model run without a pipeline would free stays alive for it.
struct GraphEnd {
  torch::autograd::Edge edge;  // invalid where the tensor needs no gradient
  torch::Device device = torch::kCPU;
  int64_t rows = 0;            // along dim 0 (0 for a scalar)
  torch::Tensor grad;          // set before the task's backward
  static GraphEnd of(const torch::Tensor& tensor);
};

// A skipped tensor that crosses partitions, seen from one end.
struct SkipEnd {
  skip::SkipKey key;
  GraphEnd stashed;  // the stash end: where its gradient enters the stashing task's graph
  GradSlot slot;     // the pop end: its boundary node's (null when it needs no gradient)
};

// The two ends of one task's local graph.
struct TaskEnds {
  std::vector<GradSlot> inputs;   // by input position; null where none is needed
  std::vector<GraphEnd> outputs;  // by output position
  std::vector<SkipEnd> popped;    // skips from earlier partitions
  std::vector<SkipEnd> stashed;   // skips for later partitions
};

// Every task's ends for one step, [i][j].
class StepGraph {
 public:
  StepGraph(int64_t micro_batches, int64_t partitions);
  TaskEnds& at(int64_t i, int64_t j) { return tasks_[static_cast<size_t>(i * partitions_ + j)]; }
  int64_t micro_batches() const { return micro_batches_; }
  int64_t partitions() const { return partitions_; }

 private:
  int64_t micro_batches_;
  int64_t partitions_;
  std::vector<TaskEnds> tasks_;
};

// `value` as a partition's input: each tensor that requires grad is replaced by a tensor of the
// same data behind a boundary node, whose slot goes to `slots` (null for the others).
Batch enter_partition(const Batch& value, std::vector<GradSlot>& slots);
// One tensor the same way (a skip popped from another partition).
torch::Tensor enter_partition(const torch::Tensor& value, GradSlot& slot);

// What the backward needs besides the graph.
struct BackwardPlan {
  std::vector<Stage> stages;
  std::shared_ptr<WorkerPool> workers;
  double task_timeout_s = 0;
  std::vector<Batch> inputs;     // the caller's micro-batches (views of its input), by i
  Batch caller_input;            // the caller's input, whose tensors get the gradients
  // Partition that stashes each crossing skip key (runtime/pipeline.cpp fills it from the plan).
  std::vector<std::pair<skip::SkipKey, int64_t>> stash_partition;
  int64_t first_mb = 0;  // the step's micro-batch keys for the fast-path Linear layers (run_pipeline)
  std::shared_ptr<StepTimeline> timeline;  // where the backward's tasks are recorded (or null)
};

// The gathered output of the step (last partition's outputs, by micro-batch), attached to the
// GPipeBackward node described above. Output tensors that need no gradient stay as they are.
Batch attach_pipelined_backward(std::shared_ptr<StepGraph> graph, BackwardPlan plan,
                                const std::vector<Batch>& outputs);

}  // namespace pipetrain::runtime
