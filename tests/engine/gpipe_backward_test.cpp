// GPipe's backward runs as a pipeline on the partitions' workers (runtime/pipeline_backward.h):
// concurrently, on the threads that ran the forward, and with autograd's semantics kept
// (retain_graph, a second backward, create_graph, in-place layers, gradients of the input).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/error.h"

namespace pipetrain {
namespace {

using testing::deep_copy;
using testing::expect_close;
using testing::grads;

// Two partitions' backwards that must be running at the same time: each waits (up to 60 s)
// until the other is inside too. One after the other they never meet; concurrent ones always
// do, however busy the machine (an ordering of events, not a duration).
struct BackwardMeeting {
  std::mutex mutex;
  std::condition_variable cv;
  std::set<int> inside;
  bool met = false;
  std::map<int, std::set<std::thread::id>> forward_threads, backward_threads;
};

// The identity, whose backward on micro-batch `meet_at` (counted in backward calls) waits at
// the meeting; it records the threads of its forwards and backwards.
struct MeetFunction : torch::autograd::Function<MeetFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, BackwardMeeting* meeting,
                               int partition, int* calls, int meet_at) {
    ctx->saved_data["partition"] = partition;
    ctx->saved_data["meet_at"] = meet_at;
    ctx->saved_data["meeting"] = reinterpret_cast<int64_t>(meeting);
    ctx->saved_data["calls"] = reinterpret_cast<int64_t>(calls);
    std::lock_guard<std::mutex> lock(meeting->mutex);
    meeting->forward_threads[partition].insert(std::this_thread::get_id());
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* meeting = reinterpret_cast<BackwardMeeting*>(ctx->saved_data["meeting"].toInt());
    auto* calls = reinterpret_cast<int*>(ctx->saved_data["calls"].toInt());
    const int partition = static_cast<int>(ctx->saved_data["partition"].toInt());
    std::unique_lock<std::mutex> lock(meeting->mutex);
    meeting->backward_threads[partition].insert(std::this_thread::get_id());
    if ((*calls)++ == ctx->saved_data["meet_at"].toInt()) {
      meeting->inside.insert(partition);
      if (meeting->inside.size() == 2) meeting->met = true;
      meeting->cv.notify_all();
      meeting->cv.wait_for(lock, std::chrono::seconds(60), [&] { return meeting->met; });
      meeting->inside.erase(partition);
    }
    return {grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

struct MeetBackwardImpl : torch::nn::Module {
  MeetBackwardImpl(std::shared_ptr<BackwardMeeting> m, int partition, int meet_at)
      : meeting(std::move(m)), partition(partition), meet_at(meet_at) {}
  torch::Tensor forward(torch::Tensor x) {
    return MeetFunction::apply(x, meeting.get(), partition, &calls, meet_at);
  }
  std::shared_ptr<BackwardMeeting> meeting;
  int partition, meet_at, calls = 0;
};
TORCH_MODULE(MeetBackward);

TEST(GPipeBackward, PartitionsRunTheirBackwardsAtTheSameTimeOnTheirWorkers) {
  // The backward's clock is the forward's reversed: at its tick 1, partition 1 runs micro-batch
  // 0 (its second backward call) while partition 0 runs micro-batch 1 (its first).
  auto meeting = std::make_shared<BackwardMeeting>();
  torch::nn::Linear first(2, 2);
  MeetBackward a(meeting, 0, /*meet_at=*/0), b(meeting, 1, /*meet_at=*/1);
  GPipe gpipe(torch::nn::Sequential(first, a, b), GPipeOptions({2, 1}).chunks(2).checkpoint(Checkpoint::Never));
  gpipe->forward(torch::randn({2, 2})).sum().backward();
  EXPECT_TRUE(meeting->met) << "partition 0's backward of micro-batch 1 and partition 1's of micro-batch 0 did "
                               "not run concurrently";
  EXPECT_EQ(a->calls, 2);
  EXPECT_EQ(b->calls, 2);
  // Each partition's backward runs on the worker that ran its forward, not on the caller.
  for (int j : {0, 1}) {
    EXPECT_EQ(meeting->backward_threads[j], meeting->forward_threads[j]) << "partition " << j;
    EXPECT_EQ(meeting->backward_threads[j].count(std::this_thread::get_id()), 0u) << "partition " << j;
  }
  EXPECT_NE(*meeting->backward_threads[0].begin(), *meeting->backward_threads[1].begin());
  EXPECT_TRUE(first->weight.grad().defined());
}

TEST(GPipeBackward, RetainGraphRunsTwiceAndASecondBackwardWithoutItIsAnError) {
  torch::manual_seed(11);
  auto model = testing::mlp6();
  auto plain = deep_copy(model);
  const torch::Tensor x = torch::randn({8, 8}, torch::requires_grad());
  // The fast-path Linear keeps its inputs for one backward only (see the next test).
  GPipe gpipe(model, GPipeOptions({3, 3}).chunks(4).deferred_linear(false));
  const torch::Tensor out = gpipe->forward(x).pow(2).sum();
  out.backward({}, /*retain_graph=*/true);
  const torch::Tensor x_grad_once = x.grad().clone();
  out.backward();
  const torch::Tensor y = plain->forward(x).pow(2).sum();
  for (int k = 0; k < 2; ++k) y.backward({}, /*retain_graph=*/true);
  expect_close(grads(*gpipe), grads(*plain), "two backwards");
  EXPECT_TRUE(torch::allclose(x.grad(), 4 * x_grad_once, 1e-5, 1e-6));  // 2 (gpipe) + 2 (plain)
  try {
    out.backward();
    FAIL() << "a third backward, after one without retain_graph, must throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("backward through the graph a second time"), std::string::npos)
        << e.what();
  }
}

TEST(GPipeBackward, RetainGraphWithTheFastPathLinearIsATypedErrorNamingTheOption) {
  GPipe gpipe(testing::mlp6(), GPipeOptions({3, 3}).chunks(2));
  const torch::Tensor out = gpipe->forward(torch::randn({4, 8})).sum();
  try {
    out.backward({}, /*retain_graph=*/true);
    FAIL() << "retain_graph through fast-path Linear layers must throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("deferred_linear(false)"), std::string::npos) << e.what();
  }
  out.backward();  // the refusal changed nothing: one backward still runs
  EXPECT_TRUE(gpipe->parameters()[0].grad().defined());
}

TEST(GPipeBackward, CreateGraphIsATypedError) {
  auto model = testing::mlp6();
  GPipe gpipe(model, GPipeOptions({3, 3}).chunks(2));
  const torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  const torch::Tensor out = gpipe->forward(x).sum();
  try {
    torch::autograd::grad({out}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph through GPipe must throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("create_graph"), std::string::npos) << e.what();
  }
}

TEST(GPipeBackward, InPlaceLayerOnAPartitionsInputAndGradOfTheInput) {
  // A partition that starts with an in-place ReLU modifies its input, which in a pipelined
  // backward is a boundary (the gradient's capture point), not a leaf.
  torch::manual_seed(12);
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)),
                              torch::nn::Linear(8, 4));
  auto plain = deep_copy(model);
  const torch::Tensor x = torch::randn({6, 8}, torch::requires_grad());
  GPipe gpipe(model, GPipeOptions({1, 2}).chunks(3).checkpoint(Checkpoint::Never));
  const auto x_grad = torch::autograd::grad({gpipe->forward(x).pow(2).sum()}, {x})[0];
  const auto x_grad_plain = torch::autograd::grad({plain->forward(x).pow(2).sum()}, {x})[0];
  EXPECT_TRUE(torch::allclose(x_grad, x_grad_plain, 1e-5, 1e-6));
  // The parameters are not edges of the pipelined backward: their gradients accumulate on the
  // workers even under autograd::grad (as under a reentrant checkpoint, torchgpipe's default).
  EXPECT_TRUE(gpipe->parameters()[0].grad().defined());
  gpipe->zero_grad();
  gpipe->forward(x).pow(2).sum().backward();
  plain->forward(x).pow(2).sum().backward();
  expect_close(grads(*gpipe), grads(*plain), "in-place ReLU at a partition's start");
}

}  // namespace
}  // namespace pipetrain
