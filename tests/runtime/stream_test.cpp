// The stream shim and the stream copies, as the CPU build runs them: one no-op stream, and
// copies that keep values and gradients (the CUDA behaviour is checked by scripts/gpu-check.sh).
#include "pipetrain/runtime/stream.h"

#include <gtest/gtest.h>

#include "pipetrain/runtime/stream_copy.h"

namespace pipetrain::runtime {
namespace {

TEST(Stream, TheCpuHasOneStreamAndWaitsAreNoOps) {
  const auto s = current_stream(torch::kCPU);
  EXPECT_EQ(s.device(), torch::Device(torch::kCPU));
  EXPECT_EQ(new_copy_stream(torch::kCPU), s);
  {
    StreamScope scope(new_copy_stream(torch::kCPU));
    EXPECT_EQ(current_stream(torch::kCPU), s);
    wait_stream(s, new_copy_stream(torch::kCPU));
  }
  EXPECT_EQ(current_stream(torch::kCPU), s);
  const auto x = torch::randn({3});
  record_stream(Batch(x), s);  // nothing to keep alive on the CPU
}

TEST(StreamCopy, ValuesAndGradientsGoThroughCopyAndWait) {
  const auto from = current_stream(torch::kCPU);
  const auto copy = new_copy_stream(torch::kCPU);
  auto x = torch::randn({4, 3}, torch::requires_grad());
  const auto mask = torch::tensor({1, 0, 1, 1}, torch::kLong);
  const Batch in = Batch::tuple({x, mask});
  Batch moved = wait_for_copy(copy_on_stream(in, from, copy), copy, current_stream(torch::kCPU));
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_TRUE(torch::equal(moved[0], x));
  EXPECT_TRUE(torch::equal(moved[1], mask));
  EXPECT_FALSE(moved[1].requires_grad());
  ASSERT_TRUE(moved[0].requires_grad());
  (moved[0] * moved[1].unsqueeze(1).to(torch::kFloat) * 3).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), mask.unsqueeze(1).to(torch::kFloat).expand({4, 3}) * 3));
}

}  // namespace
}  // namespace pipetrain::runtime
