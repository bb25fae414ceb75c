// Scatter and gather of micro-batches.
#include "pipetrain/batch/microbatch.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

std::vector<int64_t> rows_of(const std::vector<Batch>& parts) {
  std::vector<int64_t> rows;
  for (const auto& p : parts) rows.push_back(p.rows());
  return rows;
}

TEST(Scatter, TorchChunkSemantics) {
  EXPECT_EQ(rows_of(scatter(Batch(torch::zeros({7, 3})), 4)), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(rows_of(scatter(Batch(torch::zeros({2, 3})), 4)), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(rows_of(scatter(Batch(torch::zeros({8, 3})), 1)), (std::vector<int64_t>{8}));
}

TEST(Scatter, TupleKeepsItsKindAndNonFloatTensors) {
  const torch::Tensor x = torch::randn({5, 2});
  const torch::Tensor ids = torch::arange(5);
  const auto parts = scatter(Batch::tuple({x, ids}), 3);  // 2, 2, 1 rows
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_FALSE(parts[0].atomic());
  EXPECT_TRUE(torch::equal(parts[2][1], torch::tensor({4}, torch::kLong)));
  const Batch back = gather(parts);
  EXPECT_FALSE(back.atomic());
  EXPECT_TRUE(torch::equal(back[0], x));
  EXPECT_TRUE(torch::equal(back[1], ids));
}

TEST(Scatter, Errors) {
  EXPECT_THROW(scatter(Batch(torch::zeros({4})), 0), BatchError);
  EXPECT_THROW(scatter(Batch(torch::tensor(1.0)), 2), BatchError);
  EXPECT_THROW(scatter(Batch::tuple({torch::zeros({4, 1}), torch::zeros({3, 1})}), 2), BatchError);
}

TEST(Gather, InverseOfScatterAndKeepsGradients) {
  torch::Tensor x = torch::randn({9, 4}, torch::requires_grad());
  const Batch out = gather(scatter(Batch(x), 4));
  EXPECT_TRUE(out.atomic());
  EXPECT_TRUE(torch::equal(out.tensor(), x));
  out.tensor().sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones_like(x)));
  EXPECT_THROW(gather({}), BatchError);
  EXPECT_THROW(gather({Batch(x), Batch::tuple({x, x})}), BatchError);
}

}  // namespace
}  // namespace pipetrain
