// Worker threads: one long-lived thread per partition, each running its tasks in order.
//
// A partition's layers always run on the same thread, so their thread-local state (OpenMP
// team, device) stays put from step to step. Every task posts exactly one result (a value or
// the exception it threw) to its TaskResult, so the caller's waits are always woken; the pool's
// destructor closes the queues and joins the threads. A pool whose task hung (the caller's
// wait timed out) is abandoned instead: its destructor detaches the threads, which own their
// queues and touch nothing of the pool, so a task that returns late finds live state.
//
// Nothing a task made or held is released on the worker once the caller can see the result:
// the worker drops the task (its captures) first, then hands the value or exception over, and
// the caller moves it out. An exception can carry a Python error whose traceback keeps the
// model that owns this pool alive; were its last reference dropped on a worker, the model and
// this pool would be destroyed there, and the pool would join its own thread. Should a pool be
// destroyed on one of its own workers all the same, that thread is detached, not joined.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace pipetrain::runtime {

// One task's result, handed over once from the worker to the caller.
template <typename T>
class TaskResult {
 public:
  TaskResult() = default;

  // Whether the result is in by `deadline` (it is kept; get() takes it).
  bool wait_until(std::chrono::steady_clock::time_point deadline) const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    return state_->ready.wait_until(lock, deadline, [&] { return state_->done; });
  }

  // Waits for the result and moves it out: the value, or the task's exception rethrown.
  T get() {
    std::optional<T> value;
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(state_->mutex);
      state_->ready.wait(lock, [&] { return state_->done; });
      value = std::move(state_->value);
      state_->value.reset();
      error = std::move(state_->error);
      state_->error = nullptr;
    }
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }

 private:
  friend class WorkerPool;
  struct State {
    std::mutex mutex;
    std::condition_variable ready;
    bool done = false;
    std::optional<T> value;
    std::exception_ptr error;
  };
  explicit TaskResult(std::shared_ptr<State> state) : state_(std::move(state)) {}

  std::shared_ptr<State> state_;
};

class WorkerPool {
 public:
  // `intra_op_threads` > 0 sets each worker's OpenMP thread count (ATen and an OpenMP BLAS);
  // 0 leaves the process default.
  explicit WorkerPool(int64_t workers, int64_t intra_op_threads = 0);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int64_t size() const { return static_cast<int64_t>(queues_.size()); }

  // The destructor will detach the threads instead of joining them (a task has hung).
  void abandon() { abandoned_ = true; }
  bool abandoned() const { return abandoned_; }

  // Whether the calling thread is one of this pool's workers.
  bool on_worker() const;

  // Queues `task` on worker j; the result holds its value or its exception.
  template <typename T>
  TaskResult<T> submit(int64_t j, std::function<T()> task) {
    using State = typename TaskResult<T>::State;
    auto state = std::make_shared<State>();
    post(j, [state, task = std::move(task)]() mutable {
      std::optional<T> value;
      std::exception_ptr error;
      try {
        value.emplace(task());
      } catch (...) {
        error = std::current_exception();
      }
      task = nullptr;  // its captures go now, while the caller still holds what they share
      std::lock_guard<std::mutex> lock(state->mutex);
      state->value = std::move(value);
      state->error = std::move(error);
      state->done = true;
      state->ready.notify_all();
    });
    return TaskResult<T>(std::move(state));
  }

 private:
  struct Queue {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::function<void()>> tasks;
    bool closed = false;
  };

  void post(int64_t j, std::function<void()> job);
  static void loop(const std::shared_ptr<Queue>& queue, int64_t intra_op_threads);

  std::vector<std::shared_ptr<Queue>> queues_;  // shared with their threads
  std::vector<std::thread> threads_;
  std::atomic<bool> abandoned_{false};  // set by whichever thread's wait timed out
};

}  // namespace pipetrain::runtime
