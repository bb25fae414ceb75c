// GPipe really runs partitions concurrently on CPU, and a failing layer neither hangs nor lets
// upstream partitions run on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <set>
#include <thread>

#include "pipetrain/engine/gpipe.h"
#include "pipetrain/error.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

// Sleeps, then passes its input on; records the threads it ran on.
struct SleepImpl : torch::nn::Module {
  explicit SleepImpl(std::chrono::milliseconds d) : delay(d) {}
  torch::Tensor forward(torch::Tensor x) {
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
    return x;
  }
  std::chrono::milliseconds delay;
  std::mutex mutex;
  std::set<std::thread::id> threads;
};
TORCH_MODULE(Sleep);

TEST(GPipeConcurrency, SleepingPartitionsOverlap) {
  using std::chrono::milliseconds;
  Sleep a(milliseconds(100)), b(milliseconds(100));
  GPipe gpipe(torch::nn::Sequential(a, b), GPipeOptions({1, 1}).chunks(4));
  const torch::Tensor x = torch::randn({4, 2});
  gpipe->forward(x);  // start the workers
  const auto start = Clock::now();
  gpipe->forward(x);
  const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  // (4 + 2 - 1) ticks of 100 ms = 500 ms; sequential would be 8 x 100 ms = 800 ms.
  EXPECT_GE(ms, 490);
  EXPECT_LT(ms, 700) << "partitions did not run concurrently";
  // Each partition always runs on its own worker thread.
  EXPECT_EQ(a->threads.size(), 1u);
  EXPECT_EQ(b->threads.size(), 1u);
  EXPECT_NE(*a->threads.begin(), *b->threads.begin());
  EXPECT_EQ(a->threads.count(std::this_thread::get_id()), 0u);
}

// Counts its calls; throws on the call with index `fail_at` (0-based).
struct FailOnImpl : torch::nn::Module {
  explicit FailOnImpl(int f) : fail_at(f) {}
  torch::Tensor forward(torch::Tensor x) {
    const int call = calls++;
    if (call == fail_at) {
      throw std::runtime_error("layer failed on micro-batch " + std::to_string(call));
    }
    return x * 2;
  }
  int fail_at;
  std::atomic<int> calls{0};
};
TORCH_MODULE(FailOn);

TEST(GPipeConcurrency, ExceptionComesOutAndUpstreamStops) {
  // Micro-batch 2 of 3 (index 1) fails in the middle partition at tick 2.
  FailOn first(-1), middle(1), last(-1);
  GPipe gpipe(torch::nn::Sequential(first, middle, last), GPipeOptions({1, 1, 1}).chunks(3));
  const torch::Tensor x = torch::randn({3, 2});
  try {
    gpipe->forward(x);
    FAIL() << "expected the layer's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "layer failed on micro-batch 1");
  }
  // Tick 2 ran (2,0) and (1,1) together; no later tick started: the first partition ran all
  // three micro-batches by then, the last partition only micro-batch 0.
  EXPECT_EQ(first->calls.load(), 3);
  EXPECT_EQ(middle->calls.load(), 2);
  EXPECT_EQ(last->calls.load(), 1);

  // The pipeline is still usable afterwards.
  middle->fail_at = -1;
  EXPECT_TRUE(torch::allclose(gpipe->forward(x), x * 8));
}

TEST(GPipeConcurrency, ExceptionInTheFirstPartitionStopsEverything) {
  FailOn first(1), second(-1);
  GPipe gpipe(torch::nn::Sequential(first, second), GPipeOptions({1, 1}).chunks(4));
  EXPECT_THROW(gpipe->forward(torch::randn({8, 2})), std::runtime_error);
  EXPECT_EQ(first->calls.load(), 2);   // micro-batches 0, 1 (failed)
  EXPECT_EQ(second->calls.load(), 1);  // micro-batch 0, at the failing tick
}

TEST(GPipeConcurrency, PipetrainErrorsKeepTheirType) {
  // A layer that cannot take a tuple: the BatchError from the worker reaches the caller.
  GPipe gpipe(torch::nn::Sequential(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2)),
              GPipeOptions({1, 1}).chunks(2));
  EXPECT_THROW(gpipe->forward(std::vector<torch::Tensor>{torch::randn({2, 2}),
                                                         torch::randn({2, 2})}),
               BatchError);
}

// Blocks until released (or 30 s pass, so a failing test leaves no thread behind for ever).
struct HangImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    std::unique_lock<std::mutex> lock(mutex);
    entered = true;
    released_cv.wait_for(lock, std::chrono::seconds(30), [&] { return released; });
    return x;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    released_cv.notify_all();
  }
  std::mutex mutex;
  std::condition_variable released_cv;
  bool released = false;
  bool entered = false;
};
TORCH_MODULE(Hang);

TEST(GPipeConcurrency, AHungLayerIsATimeoutNamingPartitionAndMicroBatch) {
  Hang hang;
  GPipe gpipe(torch::nn::Sequential(torch::nn::Identity(), hang), GPipeOptions({1, 1}).chunks(2).task_timeout(0.3));
  const auto start = Clock::now();
  try {
    gpipe->forward(torch::randn({4, 2}));
    FAIL() << "a hung layer must not hang forward";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("partition 1"), std::string::npos) << what;
    EXPECT_NE(what.find("micro-batch 0"), std::string::npos) << what;
    EXPECT_NE(what.find("task_timeout"), std::string::npos) << what;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  // The hung task finishes on its abandoned worker; the next forward starts new workers.
  hang->release();
  const auto x = torch::randn({4, 2});
  EXPECT_TRUE(torch::equal(gpipe->forward(x), x));
}

TEST(GPipeConcurrency, TaskTimeoutMustBePositive) {
  EXPECT_THROW(GPipe(torch::nn::Sequential(torch::nn::Identity()), GPipeOptions({1}).task_timeout(0)), ConfigError);
}

TEST(GPipeConcurrency, GradModeOfTheCallerReachesTheWorkers) {
  GPipe gpipe(torch::nn::Sequential(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2)),
              GPipeOptions({1, 1}).chunks(2).checkpoint(Checkpoint::Never));
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(gpipe->forward(torch::randn({4, 2})).requires_grad());
  }
  EXPECT_TRUE(gpipe->forward(torch::randn({4, 2})).requires_grad());
}

}  // namespace
}  // namespace pipetrain
