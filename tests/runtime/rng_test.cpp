// RNG snapshots, seeded scopes and task generators.
#include "pipetrain/runtime/rng.h"

#include <gtest/gtest.h>

#include <thread>

namespace pipetrain::runtime {
namespace {

TEST(RngSnapshot, RestoreRepeatsTheDraws) {
  torch::manual_seed(3);
  const RngSnapshot snapshot = RngSnapshot::capture();
  const torch::Tensor first = torch::randn({16});
  snapshot.restore();
  EXPECT_TRUE(torch::equal(first, torch::randn({16})));
}

TEST(SeededScope, SeedsAndPutsThePreviousStateBack) {
  torch::manual_seed(1);
  const torch::Tensor expected_after = [] {
    const RngSnapshot s = RngSnapshot::capture();
    torch::Tensor t = torch::randn({4});
    s.restore();
    return t;
  }();
  torch::Tensor seeded;
  {
    SeededScope scope(42);
    seeded = torch::randn({4});
  }
  EXPECT_TRUE(torch::equal(torch::randn({4}), expected_after));  // untouched outside
  torch::manual_seed(42);
  EXPECT_TRUE(torch::equal(seeded, torch::randn({4})));
}

TEST(SeededScope, ConcurrentThreadsGetTheirOwnSeedsDraws) {
  std::vector<torch::Tensor> expected;
  for (int t = 0; t < 4; ++t) {
    torch::manual_seed(100 + t);
    expected.push_back(torch::randn({256}));
  }
  std::vector<torch::Tensor> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &got] {
      for (int repeat = 0; repeat < 20; ++repeat) {
        SeededScope scope(100 + t);
        got[t] = torch::randn({256});
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(torch::equal(got[t], expected[t])) << t;
}

TEST(TaskGenerator, InstalledPerThreadAndNested) {
  EXPECT_FALSE(has_task_generator());
  at::Generator a = make_generator(7);
  {
    TaskGeneratorScope outer(a);
    EXPECT_TRUE(has_task_generator());
    {
      TaskGeneratorScope inner(make_generator(8));
      EXPECT_NE(current_generator().unsafeGetGeneratorImpl(), a.unsafeGetGeneratorImpl());
    }
    EXPECT_EQ(current_generator().unsafeGetGeneratorImpl(), a.unsafeGetGeneratorImpl());
    bool other_thread_has = true;
    std::thread([&] { other_thread_has = has_task_generator(); }).join();
    EXPECT_FALSE(other_thread_has);
  }
  EXPECT_FALSE(has_task_generator());
}

TEST(TaskGenerator, CloneRepeatsTheDraws) {
  at::Generator g = make_generator(5);
  at::Generator copy = clone_generator(g);
  const torch::Tensor a = torch::empty({64}).bernoulli_(0.5, g);
  const torch::Tensor b = torch::empty({64}).bernoulli_(0.5, copy);
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(TaskGenerator, OnTheCpuADevicesGeneratorIsTheTaskStreamItself) {
  at::Generator task = make_generator(11);
  TaskGeneratorScope scope(task);
  EXPECT_EQ(current_generator(torch::kCPU).unsafeGetGeneratorImpl(), task.unsafeGetGeneratorImpl());
  const auto a = torch::empty({64}).bernoulli_(0.5, make_generator(5, torch::kCPU));
  const auto b = torch::empty({64}).bernoulli_(0.5, make_generator(5));
  EXPECT_TRUE(torch::equal(a, b));
}

// CUDA machines only (scripts/gpu-check.sh): a CUDA mask comes from a generator seeded by the
// task stream, so a restored stream repeats it and the stream moves on by one draw.
TEST(TaskGenerator, OnAGpuTheTaskStreamSeedsAGeneratorOfTheDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  const torch::Device cuda(torch::kCUDA, 0);
  at::Generator task = make_generator(11);
  const at::Generator saved = clone_generator(task);
  torch::Tensor first, again, next;
  {
    TaskGeneratorScope scope(task);
    first = torch::empty({4096}, torch::TensorOptions().device(cuda)).bernoulli_(0.5, current_generator(cuda));
    next = torch::empty({4096}, torch::TensorOptions().device(cuda)).bernoulli_(0.5, current_generator(cuda));
  }
  {
    TaskGeneratorScope scope(clone_generator(saved));
    again = torch::empty({4096}, torch::TensorOptions().device(cuda)).bernoulli_(0.5, current_generator(cuda));
  }
  EXPECT_TRUE(torch::equal(first, again));
  EXPECT_FALSE(torch::equal(first, next));
  EXPECT_GT(first.sum().item<double>(), 1000);
}

TEST(TaskGenerator, SeedsDifferPerTask) {
  EXPECT_NE(task_seed(1, 0, 1), task_seed(1, 1, 0));
  EXPECT_NE(task_seed(1, 0, 0), task_seed(2, 0, 0));
  EXPECT_EQ(task_seed(9, 3, 4), task_seed(9, 3, 4));
}

}  // namespace
}  // namespace pipetrain::runtime
