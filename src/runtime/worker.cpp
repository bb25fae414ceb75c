// Worker threads: one long-lived thread per partition.
#include "pipetrain/runtime/worker.h"

#include <omp.h>

#include "pipetrain/error.h"

namespace pipetrain::runtime {

WorkerPool::WorkerPool(int64_t workers, int64_t intra_op_threads) {
  for (int64_t j = 0; j < workers; ++j) queues_.push_back(std::make_shared<Queue>());
  for (int64_t j = 0; j < workers; ++j) {
    threads_.emplace_back([queue = queues_[j], intra_op_threads] { loop(queue, intra_op_threads); });
  }
}

WorkerPool::~WorkerPool() {
  for (auto& q : queues_) {
    std::lock_guard<std::mutex> lock(q->mutex);
    q->closed = true;
    q->ready.notify_all();
  }
  const auto self = std::this_thread::get_id();
  for (auto& t : threads_) {
    if (abandoned_) {
      t.detach();  // a hung task keeps its thread; it ends when the task returns
    } else if (t.get_id() == self) {
      // Destroyed by one of its own tasks (see worker.h): joining would throw and abort. The
      // thread owns its queue, now closed, and ends when this task returns.
      t.detach();
    } else {
      t.join();
    }
  }
}

bool WorkerPool::on_worker() const {
  const auto self = std::this_thread::get_id();
  for (const auto& t : threads_) {
    if (t.get_id() == self) return true;
  }
  return false;
}

void WorkerPool::post(int64_t j, std::function<void()> job) {
  if (j < 0 || j >= size()) {
    throw UsageError("worker " + std::to_string(j) + " does not exist; the pool has " +
                     std::to_string(size()) + " workers");
  }
  Queue& q = *queues_[j];
  std::lock_guard<std::mutex> lock(q.mutex);
  q.tasks.push_back(std::move(job));
  q.ready.notify_one();
}

void WorkerPool::loop(const std::shared_ptr<Queue>& shared, int64_t intra_op_threads) {
  Queue& queue = *shared;
  // Per-thread OpenMP setting: ATen's parallel regions and an OpenMP BLAS read it per call.
  if (intra_op_threads > 0) omp_set_num_threads(static_cast<int>(intra_op_threads));
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(queue.mutex);
      queue.ready.wait(lock, [&] { return queue.closed || !queue.tasks.empty(); });
      if (queue.tasks.empty()) return;  // closed and drained
      job = std::move(queue.tasks.front());
      queue.tasks.pop_front();
    }
    job();  // catches its task's exception into the TaskResult
  }
}

}  // namespace pipetrain::runtime
