// What a checkpoint saves to replay its random draws: the CPU generator unless the task is known
// to draw nothing from it, the device generators always (torch.utils.checkpoint's rule); and a
// lease sees draws on any generator. The GPU half (nested nn::Dropout on cuda:0 recomputed alike)
// is tests/engine/cuda_dropout_test.cpp, skipped without CUDA.
#include <gtest/gtest.h>

#include "pipetrain/runtime/rng.h"

namespace pipetrain::runtime {
namespace {

TEST(CheckpointRng, SavesTheCpuGeneratorUnlessTheTaskDrawsNothingAndTheDevicesAlways) {
  const auto devices = static_cast<size_t>(torch::cuda::device_count());
  {
    const RngSnapshot leased = checkpoint_rng_snapshot();
    EXPECT_TRUE(leased.cpu.defined());
    EXPECT_EQ(leased.cuda.size(), devices);
  }
  FreeOfDrawsScope free;
  ASSERT_TRUE(free_of_draws());
  const RngSnapshot snapshot = checkpoint_rng_snapshot();
  EXPECT_FALSE(snapshot.cpu.defined());
  EXPECT_EQ(snapshot.cuda.size(), devices);  // not skipped with the CPU's (a GPU dropout draws there)
  // A device-only snapshot says "moved" only for the devices: CPU draws meanwhile are not its.
  torch::rand({4});
  EXPECT_FALSE(snapshot.moved_since());
}

TEST(CheckpointRng, ALeaseFromAStreamSeesDrawsAndGivesTheDefaultGeneratorItsStateBack) {
  const torch::Tensor before = generator_state(at::detail::getDefaultCPUGenerator());
  at::Generator stream = make_generator(5);
  {
    DefaultGeneratorLease lease(stream);
    EXPECT_FALSE(lease.drew());
    torch::rand({3});
    EXPECT_TRUE(lease.drew());
  }
  EXPECT_TRUE(torch::equal(generator_state(at::detail::getDefaultCPUGenerator()), before));
  // The same stream state draws the same again (the task's draws do not depend on the order).
  at::Generator again = make_generator(5);
  torch::Tensor a, b;
  {
    DefaultGeneratorLease lease(make_generator(5));
    a = torch::rand({3});
  }
  {
    DefaultGeneratorLease lease(again);
    b = torch::rand({3});
  }
  EXPECT_TRUE(torch::equal(a, b));
}

}  // namespace
}  // namespace pipetrain::runtime
