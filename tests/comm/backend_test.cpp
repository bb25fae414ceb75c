// Which backend a rank's collectives take: NCCL only where it can run (a GPU per local rank).
#include <gtest/gtest.h>

#include "pipetrain/comm/options.h"

namespace pipetrain::comm {
namespace {

TEST(CollectiveBackend, NcclWhenEveryLocalRankHasItsOwnGpu) {
  EXPECT_EQ(collective_backend(true, 2, 2, true), Backend::Nccl);
  EXPECT_EQ(collective_backend(true, 1, 8, true), Backend::Nccl);
}

TEST(CollectiveBackend, GlooWhenRanksShareAGpuOrThereIsNoNcclOrNoGpu) {
  EXPECT_EQ(collective_backend(true, 2, 1, true), Backend::Gloo);   // NCCL: "duplicate GPU"
  EXPECT_EQ(collective_backend(true, 2, 2, false), Backend::Gloo);  // CPU-only LibTorch
  EXPECT_EQ(collective_backend(false, 2, 2, true), Backend::Gloo);  // the stage runs on the CPU
}

TEST(CollectiveBackend, TheDefaultAsksThisLibTorch) {
  EXPECT_EQ(collective_backend(true, 1, 1), nccl_available() ? Backend::Nccl : Backend::Gloo);
}

}  // namespace
}  // namespace pipetrain::comm
