// Worker threads: one thread per worker, ordered tasks, exceptions in futures.
#include "pipetrain/runtime/worker.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

TEST(WorkerPool, EachWorkerIsOneThreadRunningTasksInOrder) {
  WorkerPool pool(2);
  std::vector<std::future<std::thread::id>> ids;
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

TEST(WorkerPool, ExceptionsLandInTheFuture) {
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

}  // namespace
}  // namespace pipetrain::runtime
