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

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace pipetrain::runtime {

// Where a CPU generator is in its stream: equal positions mean nothing drew in between.
struct CpuGeneratorPosition {
  int left = 0;
  uint32_t next = 0;
  std::array<uint32_t, 624> words{};
  std::optional<float> cached_float;
  std::optional<double> cached_double;

  static CpuGeneratorPosition of(const at::Generator& cpu_generator);
  bool operator==(const CpuGeneratorPosition& other) const;
};

// The default generators' states (CPU, and every CUDA device when there is one).
struct RngSnapshot {
  torch::Tensor cpu;                // state of at::detail::getDefaultCPUGenerator()
  CpuGeneratorPosition cpu_position;
  std::vector<torch::Tensor> cuda;  // one per CUDA device; empty without CUDA

  static RngSnapshot capture();
  // The device generators alone (every CUDA device; nothing without CUDA), `cpu` left undefined.
  static RngSnapshot capture_devices();
  // Puts every captured state back (a default snapshot restores nothing).
  void restore() const;
  // Puts the CUDA generators' captured states back, leaving the CPU generator as it is.
  void restore_cuda() const;
  // Whether a generator's state now differs from the captured one (something drew).
  bool moved_since() const;
};

// What a checkpoint saves before its forward, to replay on recomputation: the default CPU
// generator unless this thread's task is known to draw nothing from it (free_of_draws()), and the
// device generators always, as torch.utils.checkpoint does: a dropout nested in a custom block on
// a GPU draws from the device's generator, whatever the CPU's draw history says.
RngSnapshot checkpoint_rng_snapshot();

// The process-wide lock around seeded sections of the default CPU generator.
std::recursive_timed_mutex& rng_mutex();
// How long a lease or seeded scope waits for the lock before a TimeoutError: a task that hung
// while holding it (GPipe gives such a task up, runtime/pipeline.h) must not hang the rest.
inline constexpr std::chrono::seconds kRngLockTimeout{300};

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
  std::unique_lock<std::recursive_timed_mutex> lock_;
  torch::Tensor saved_cpu_;
};

// A fresh CPU generator seeded with `seed`.
at::Generator make_generator(uint64_t seed);
// A fresh generator of `device`'s kind (CUDA: its Philox engine) seeded with `seed`, made through
// LibTorch's device-generic interface (a copy of the device's default generator, reseeded).
at::Generator make_generator(uint64_t seed, const c10::Device& device);

// The thread's task generator when one is installed, else the default CPU generator.
at::Generator current_generator();
// What a random op on `device` draws from: current_generator() on the CPU; on another device a
// fresh generator of it, seeded from current_generator()'s stream. So a recomputation that
// restores the CPU stream draws the same device masks, and concurrent partitions never share a
// device generator's state (CUDA's default one is process-wide).
at::Generator current_generator(const c10::Device& device);
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

// Lends the process's default CPU generator to this thread for the scope (under rng_mutex(),
// so no other leasing thread draws from it meanwhile). torch::dropout, torch::rand, a Dropout
// nested in a custom module: every op that draws without an explicit generator draws from the
// default one, so only a lease makes those draws reproducible while other threads run.
//   DefaultGeneratorLease()        lends it as it is (the engine: one stream per process)
//   DefaultGeneratorLease(stream)  lends it starting from `stream`'s state; at the end the
//                                  stream takes the state the draws left and the default
//                                  generator gets its own back (GPipe: one stream per task).
//                                  Each device's default generator (CUDA) is seeded from the
//                                  stream for the scope and gets its own state back at the end,
//                                  so partitions sharing a GPU draw the same masks whatever
//                                  order their tasks run in.
// drew() sees the device generators too: a part whose dropout draws on a GPU stays leased.
class DefaultGeneratorLease {
 public:
  DefaultGeneratorLease();
  explicit DefaultGeneratorLease(at::Generator stream);
  ~DefaultGeneratorLease();
  DefaultGeneratorLease(const DefaultGeneratorLease&) = delete;
  DefaultGeneratorLease& operator=(const DefaultGeneratorLease&) = delete;

  // Whether anything drew from the default generator since the lease began.
  bool drew() const;

 private:
  friend class LeaseSuspension;
  DefaultGeneratorLease* outer_;  // the thread's enclosing lease, if any
  std::unique_lock<std::recursive_timed_mutex> lock_;
  at::Generator stream_;
  torch::Tensor saved_;             // the default generator's own state (stream leases)
  CpuGeneratorPosition installed_;  // where it was when the lease began
  std::vector<torch::Tensor> devices_installed_;  // the device generators' states then
  std::vector<torch::Tensor> devices_saved_;      // their own states (stream leases)
  int previous_policy_;
};

// Lets other threads lease the default generator while this one waits for them: ranks that are
// threads of one process and meet in a collective inside their leased forwards (tensor
// parallelism) would otherwise wait for each other's lease until the timeout. The default
// generator gets its own state back meanwhile; on resumption this thread re-takes the lock and
// continues its stream where it was. No-op without a lease, or when the lock is held more than
// once on this thread (then the wait is as before).
class LeaseSuspension {
 public:
  LeaseSuspension();
  ~LeaseSuspension();
  LeaseSuspension(const LeaseSuspension&) = delete;
  LeaseSuspension& operator=(const LeaseSuspension&) = delete;

 private:
  DefaultGeneratorLease* lease_ = nullptr;
  torch::Tensor progress_;  // the leased stream's state at the suspension
};

// Whether this thread's draws from the default generator are already taken care of: it holds a
// lease, or runs a task known not to draw (FreeOfDrawsScope). Checkpoints take a lease otherwise.
bool default_generator_covered();

// Whether this thread runs in a FreeOfDrawsScope (and holds no lease inside it).
bool free_of_draws();

// Marks the scope as a task that draws nothing from the default generator (GPipe learned so
// from its earlier runs), so that checkpoints inside need no lease and tasks stay concurrent.
class FreeOfDrawsScope {
 public:
  FreeOfDrawsScope();
  ~FreeOfDrawsScope();
  FreeOfDrawsScope(const FreeOfDrawsScope&) = delete;
  FreeOfDrawsScope& operator=(const FreeOfDrawsScope&) = delete;

 private:
  int previous_policy_;
};

// What a model part's forwards drew from the default CPU generator, learned per mode (eval,
// train): its forwards lease the generator (one at a time, process-wide) until a leased run in
// that mode drew nothing; from then on they run free and concurrently with other parts. A
// part that draws only on some inputs must draw on the first, or through current_generator().
struct DrawHistory {
  enum : int { kUnknown = 0, kDraws = 1, kDrawsNothing = 2 };
  std::atomic<int> by_mode[2] = {kUnknown, kUnknown};
};

// One forward of a part under its DrawHistory: leases the default generator (from `stream`
// when defined, else as it is) or marks the scope free of draws; on a normal exit a leased
// forward records whether it drew.
class LearnedLease {
 public:
  LearnedLease(DrawHistory& history, bool training, at::Generator stream);
  ~LearnedLease();
  LearnedLease(const LearnedLease&) = delete;
  LearnedLease& operator=(const LearnedLease&) = delete;

 private:
  std::atomic<int>& slot_;
  std::optional<DefaultGeneratorLease> lease_;
  std::optional<FreeOfDrawsScope> free_;
  int exceptions_;
};

// A generator's state, and setting it, each under the generator's own mutex.
torch::Tensor generator_state(const at::Generator& generator);
void set_generator_state(const at::Generator& generator, const torch::Tensor& state);

// A new CPU generator in the state `state` (a get_state() of one).
at::Generator generator_with_state(const torch::Tensor& state);

// A copy of a generator's state as a new generator (locks the source while copying).
at::Generator clone_generator(const at::Generator& generator);

// A 64-bit seed for task (i, j) of a forward pass whose base seed is `base` (splitmix64).
uint64_t task_seed(uint64_t base, int64_t i, int64_t j);

}  // namespace pipetrain::runtime
