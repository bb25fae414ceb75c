// Random-number state: snapshots of the default generators, seeded scopes, and the
// thread-local task generator that keeps concurrent pipeline workers' draws apart.
//
// LibTorch has one default CPU generator per process. Two partition threads drawing from it at
// the same time interleave their draws in an order that changes from run to run, so a state
// captured before a forward cannot reproduce that forward's dropout masks. pipetrain therefore
// gives every (partition, micro-batch) task its own generator, installed as the thread's
// *task generator* while the task runs; pipetrain's own random layers (runtime::Dropout, which
// GPipe substitutes for torch::nn::Dropout) draw from `current_generator()`. Code that runs
// with no task generator installed draws from the default generator, as usual.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace pipetrain::runtime {

// The default generators' states (CPU, and every CUDA device when there is one).
struct RngSnapshot {
  torch::Tensor cpu;                // state of at::detail::getDefaultCPUGenerator()
  std::vector<torch::Tensor> cuda;  // one per CUDA device; empty without CUDA

  static RngSnapshot capture();
  // Puts every captured state back (a default snapshot restores nothing).
  void restore() const;
};

// The process-wide lock around seeded sections of the default CPU generator.
std::recursive_mutex& rng_mutex();

// Runs the scope with the default CPU generator seeded to `seed`, then puts back the previous
// state. Holds a process-wide mutex, so threads that build layers concurrently do not
// interleave draws. Nesting on one thread is allowed (the mutex is recursive).
class SeededScope {
 public:
  explicit SeededScope(uint64_t seed);
  ~SeededScope();
  SeededScope(const SeededScope&) = delete;
  SeededScope& operator=(const SeededScope&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  torch::Tensor saved_cpu_;
};

// A fresh CPU generator seeded with `seed`.
at::Generator make_generator(uint64_t seed);

// The thread's task generator when one is installed, else the default CPU generator.
at::Generator current_generator();
// Whether a task generator is installed on this thread.
bool has_task_generator();

// Installs `generator` as this thread's task generator for the scope (nests; an undefined
// generator uninstalls it for the scope).
class TaskGeneratorScope {
 public:
  explicit TaskGeneratorScope(at::Generator generator);
  ~TaskGeneratorScope();
  TaskGeneratorScope(const TaskGeneratorScope&) = delete;
  TaskGeneratorScope& operator=(const TaskGeneratorScope&) = delete;

 private:
  at::Generator previous_;
};

// A copy of a generator's state as a new generator (locks the source while copying).
at::Generator clone_generator(const at::Generator& generator);

// A 64-bit seed for task (i, j) of a forward pass whose base seed is `base` (splitmix64).
uint64_t task_seed(uint64_t base, int64_t i, int64_t j);

}  // namespace pipetrain::runtime
