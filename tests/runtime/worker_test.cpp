// Worker threads: one thread per worker, ordered tasks, exceptions in results, and what is
// released on which thread.
#include "pipetrain/runtime/worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

TEST(WorkerPool, EachWorkerIsOneThreadRunningTasksInOrder) {
  WorkerPool pool(2);
  std::vector<TaskResult<std::thread::id>> ids;
  std::vector<int> order;
  for (int k = 0; k < 5; ++k) {
    pool.submit<int>(0, [&order, k] { order.push_back(k); return k; });
    ids.push_back(pool.submit<std::thread::id>(k % 2, [] { return std::this_thread::get_id(); }));
  }
  std::vector<std::thread::id> got;
  for (auto& f : ids) got.push_back(f.get());
  EXPECT_EQ(got[0], got[2]);
  EXPECT_EQ(got[1], got[3]);
  EXPECT_NE(got[0], got[1]);
  EXPECT_NE(got[0], std::this_thread::get_id());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(WorkerPool, ExceptionsLandInTheResult) {
  WorkerPool pool(1);
  auto f = pool.submit<int>(0, []() -> int { throw std::runtime_error("task failed"); });
  EXPECT_THROW(f.get(), std::runtime_error);
  EXPECT_EQ(pool.submit<int>(0, [] { return 3; }).get(), 3);  // the worker lives on
  EXPECT_THROW(pool.submit<int>(1, [] { return 0; }), UsageError);
}

TEST(WorkerPool, DestructorDrainsQueuedTasks) {
  std::atomic<int> done{0};
  {
    WorkerPool pool(2);
    for (int k = 0; k < 10; ++k) pool.submit<int>(k % 2, [&done] { return ++done; });
  }
  EXPECT_EQ(done.load(), 10);
}

// Records the thread that destroys it (a stand-in for a Python object whose release may free
// the model that owns the pool).
struct Witness {
  std::shared_ptr<std::atomic<std::thread::id>> destroyed_on = std::make_shared<std::atomic<std::thread::id>>();
  Witness() = default;
  Witness(const Witness&) = default;
  ~Witness() {
    if (destroyed_on.use_count() == 2) destroyed_on->store(std::this_thread::get_id());  // the last copy
  }
};

struct WitnessedError : std::runtime_error {
  explicit WitnessedError(Witness w) : std::runtime_error("task failed"), witness(std::move(w)) {}
  Witness witness;
};

TEST(WorkerPool, ATasksCapturesAreGoneBeforeItsResultIsSeen) {
  WorkerPool pool(1);
  std::weak_ptr<int> capture;
  TaskResult<int> result;
  {
    auto held = std::make_shared<int>(7);
    capture = held;
    result = pool.submit<int>(0, [held] { return *held; });
  }
  EXPECT_EQ(result.get(), 7);
  // Dropped by the worker before it handed the value over, not later when it gets to it.
  EXPECT_TRUE(capture.expired());
}

TEST(WorkerPool, ATasksExceptionIsReleasedByTheCaller) {
  WorkerPool pool(1);
  auto observed = std::make_shared<std::atomic<std::thread::id>>();
  for (int round = 0; round < 50; ++round) {
    {
      Witness witness;
      observed = witness.destroyed_on;
      auto result = pool.submit<int>(0, [witness]() -> int { throw WitnessedError(witness); });
      EXPECT_THROW(result.get(), WitnessedError);
    }
    pool.submit<int>(0, [] { return 0; }).get();  // the worker is past the failed task
    ASSERT_EQ(observed->load(), std::this_thread::get_id()) << "round " << round;
  }
}

TEST(WorkerPool, APoolDestroyedByItsOwnTaskDetachesThatWorker) {
  auto pool = std::make_shared<WorkerPool>(2);
  auto last = pool;  // the task's copy becomes the last one
  std::weak_ptr<WorkerPool> watch = pool;
  pool.reset();
  auto result = last->submit<bool>(0, [&last] {
    const bool on_worker = last->on_worker();
    last.reset();  // ~WorkerPool on worker 0: must not join itself (std::terminate)
    return on_worker;
  });
  EXPECT_TRUE(result.get());
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace pipetrain::runtime
