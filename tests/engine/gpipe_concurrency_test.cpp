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

// Where two partitions must be inside a forward at the same time: each waits (up to 60 s) in
// its forward until the other is in its own. Partitions that run one after the other never
// meet; concurrent ones always do, however slow or busy the machine (an ordering of events,
// not a duration).
struct Meeting {
  std::mutex mutex;
  std::condition_variable cv;
  std::set<int> inside;  // the partitions inside their meeting call now
  bool met = false;
};

// Passes its input on; on call `meet_at` (0-based) it waits at the meeting. Records the
// threads it ran on.
struct MeetImpl : torch::nn::Module {
  MeetImpl(std::shared_ptr<Meeting> m, int partition, int meet_at)
      : meeting(std::move(m)), partition(partition), meet_at(meet_at) {}
  torch::Tensor forward(torch::Tensor x) {
    std::unique_lock<std::mutex> lock(meeting->mutex);
    threads.insert(std::this_thread::get_id());
    if (calls++ != meet_at) return x;
    meeting->inside.insert(partition);
    if (meeting->inside.size() == 2) meeting->met = true;
    meeting->cv.notify_all();
    meeting->cv.wait_for(lock, std::chrono::seconds(60), [&] { return meeting->met; });
    meeting->inside.erase(partition);
    return x;
  }
  std::shared_ptr<Meeting> meeting;
  int partition, meet_at, calls = 0;
  std::set<std::thread::id> threads;  // guarded by meeting->mutex
};
TORCH_MODULE(Meet);

TEST(GPipeConcurrency, PartitionsRunAtTheSameTime) {
  // At clock tick 1, partition 0 runs micro-batch 1 while partition 1 runs micro-batch 0.
  auto meeting = std::make_shared<Meeting>();
  Meet a(meeting, 0, /*meet_at=*/1), b(meeting, 1, /*meet_at=*/0);
  GPipe gpipe(torch::nn::Sequential(a, b), GPipeOptions({1, 1}).chunks(4));
  const torch::Tensor x = torch::randn({4, 2});
  EXPECT_TRUE(torch::equal(gpipe->forward(x), x));
  EXPECT_TRUE(meeting->met) << "partition 0's micro-batch 1 and partition 1's micro-batch 0 did not run concurrently";
  EXPECT_EQ(a->calls, 4);
  EXPECT_EQ(b->calls, 4);
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

// Blocks until released (or 300 s pass, so a failing test leaves no thread behind for ever).
struct HangImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    std::unique_lock<std::mutex> lock(mutex);
    entered = true;
    released_cv.wait_for(lock, std::chrono::seconds(300), [&] { return released; });
    returned = true;
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
  bool returned = false;  // the forward ended (released or out of patience)
};
TORCH_MODULE(Hang);

TEST(GPipeConcurrency, AHungLayerIsATimeoutNamingPartitionAndMicroBatch) {
  Hang hang;
  GPipe gpipe(torch::nn::Sequential(torch::nn::Identity(), hang), GPipeOptions({1, 1}).chunks(2).task_timeout(0.3));
  try {
    gpipe->forward(torch::randn({4, 2}));
    FAIL() << "a hung layer must not hang forward";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("partition 1"), std::string::npos) << what;
    EXPECT_NE(what.find("micro-batch 0"), std::string::npos) << what;
    EXPECT_NE(what.find("task_timeout"), std::string::npos) << what;
  }
  {
    // The timeout ended forward while the layer was still blocked: forward did not wait for it.
    std::lock_guard<std::mutex> lock(hang->mutex);
    EXPECT_TRUE(hang->entered);
    EXPECT_FALSE(hang->returned) << "forward returned only after the hung layer did";
  }
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
