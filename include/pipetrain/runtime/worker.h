// Worker threads: one long-lived thread per partition, each running its tasks in order.
//
// A partition's layers always run on the same thread, so their thread-local state (OpenMP
// team, device) stays put from step to step. Every task posts exactly one result (a value or
// the exception it threw) to its future, so the caller's waits are always woken; the pool's
// destructor closes the queues and joins the threads. A pool whose task hung (the caller's
// wait timed out) is abandoned instead: its destructor detaches the threads, which own their
// queues and touch nothing of the pool, so a task that returns late finds live state.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace pipetrain::runtime {

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

  // Queues `task` on worker j; the future holds its result or its exception.
  template <typename T>
  std::future<T> submit(int64_t j, std::function<T()> task) {
    auto packaged = std::make_shared<std::packaged_task<T()>>(std::move(task));
    std::future<T> result = packaged->get_future();
    post(j, [packaged] { (*packaged)(); });
    return result;
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
  bool abandoned_ = false;
};

}  // namespace pipetrain::runtime
