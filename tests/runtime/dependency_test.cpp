// Fork/join pass gradients through unchanged and order backward: the joined branch first.
#include "pipetrain/runtime/dependency.h"

#include <gtest/gtest.h>

namespace pipetrain::runtime {
namespace {

TEST(Dependency, GradientsPassThroughUnchanged) {
  torch::Tensor a = torch::randn({3}, torch::requires_grad());
  torch::Tensor b = torch::randn({3}, torch::requires_grad());
  Batch from(a * 2), to(b * 3);
  depend(from, to);
  (from.tensor().sum() + to.tensor().sum()).backward();
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({3}, 2.0)));
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({3}, 3.0)));
}

TEST(Dependency, JoinedBranchRunsBackwardFirst) {
  // `from` stands for partition j's output of micro-batch i-1, `to` for its input of micro-batch
  // i; the products after the join stand for partition j's work on micro-batch i. Without the
  // dependency autograd (latest node first) would reach `from_value` before the join.
  std::vector<std::string> order;
  torch::Tensor a = torch::randn({3}, torch::requires_grad());
  torch::Tensor b = torch::randn({3}, torch::requires_grad());
  torch::Tensor to_value = b * 3;
  torch::Tensor from_value = a * 2;
  from_value.register_hook([&](const torch::Tensor& g) { order.push_back("from"); return g; });
  Batch from(from_value), to(to_value);
  depend(from, to);
  to.tensor().register_hook([&](const torch::Tensor& g) { order.push_back("to"); return g; });
  const torch::Tensor y_to = to.tensor() * 3;
  const torch::Tensor y_from = from.tensor() * 5;
  (y_from.sum() + y_to.sum()).backward();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], "to");
  EXPECT_EQ(order[1], "from");
}

TEST(Dependency, NothingWithoutGrad) {
  Batch from(torch::randn({2})), to(torch::randn({2}));
  const torch::Tensor before = to.tensor();
  depend(from, to);
  EXPECT_TRUE(to.tensor().is_same(before));
  torch::NoGradGuard no_grad;
  Batch f2(torch::randn({2}, torch::requires_grad())), t2(torch::randn({2}));
  const torch::Tensor before2 = t2.tensor();
  depend(f2, t2);
  EXPECT_TRUE(t2.tensor().is_same(before2));
}

TEST(Dependency, ForkGivesAPhonyThatRequiresGrad) {
  torch::Tensor a = torch::randn({2}, torch::requires_grad());
  auto [out, phony] = fork(a * 1);
  EXPECT_EQ(phony.numel(), 0);
  EXPECT_TRUE(phony.requires_grad());
  EXPECT_TRUE(torch::equal(out, a));
  const torch::Tensor joined = join(torch::ones({2}), phony);
  EXPECT_TRUE(joined.requires_grad());
}

}  // namespace
}  // namespace pipetrain::runtime
