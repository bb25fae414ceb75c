// tune_malloc_for_training applies its settings where the C library is glibc.
#include "pipetrain/util/malloc_tuning.h"

#include <gtest/gtest.h>

namespace pipetrain::util {
namespace {

TEST(MallocTuning, AppliesOnGlibc) {
#if defined(__GLIBC__)
  EXPECT_TRUE(tune_malloc_for_training());
#else
  EXPECT_FALSE(tune_malloc_for_training());
#endif
}

}  // namespace
}  // namespace pipetrain::util
