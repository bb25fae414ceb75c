// The allocation counter sees real CPU storage, on this thread and on threads that inherit it.
#include "pipetrain/runtime/allocation_counter.h"

#include <ATen/ThreadLocalState.h>
#include <gtest/gtest.h>

#include <thread>

namespace pipetrain::runtime {
namespace {

TEST(AllocationCounter, CountsLiveStorage) {
  const torch::Tensor before = torch::ones({1000});
  AllocationCounter counter;
  EXPECT_EQ(counter.live_bytes(), 0);
  {
    torch::Tensor t = torch::empty({1024}, torch::kFloat);
    EXPECT_EQ(counter.live_bytes(), 4096);
    torch::Tensor view = t.narrow(0, 0, 10);  // no new storage
    EXPECT_EQ(counter.live_bytes(), 4096);
  }
  EXPECT_EQ(counter.live_bytes(), 0);
  EXPECT_EQ(counter.peak_bytes(), 4096);
}

TEST(AllocationCounter, ThreadsUnderTheCallersStateAreCounted) {
  AllocationCounter counter;
  torch::Tensor made;
  const at::ThreadLocalState state;
  std::thread([&] {
    at::ThreadLocalStateGuard guard(state);
    made = torch::empty({256}, torch::kDouble);
  }).join();
  EXPECT_EQ(counter.live_bytes(), 2048);
}

TEST(AllocationCounter, SeesWhatAutogradSaves) {
  torch::Tensor w = torch::randn({64, 64}, torch::requires_grad());
  const torch::Tensor x = torch::randn({32, 64});
  int64_t with_graph = 0, without_graph = 0;
  {
    AllocationCounter counter;
    torch::Tensor y = torch::tanh(torch::tanh(x.mm(w)));  // keeps the tanh outputs
    with_graph = counter.live_bytes();
  }
  {
    torch::NoGradGuard no_grad;
    AllocationCounter counter;
    torch::Tensor y = torch::tanh(torch::tanh(x.mm(w)));
    without_graph = counter.live_bytes();
  }
  EXPECT_EQ(without_graph, 32 * 64 * 4);  // the output only
  EXPECT_EQ(with_graph, 2 * 32 * 64 * 4);  // plus the first tanh's output, saved for backward
}

}  // namespace
}  // namespace pipetrain::runtime
