// Keeps freed activation buffers in the heap instead of returning them to the kernel.
#include "pipetrain/util/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pipetrain::util {

bool tune_malloc_for_training() {
#if defined(__GLIBC__)
  constexpr int kMmapThreshold = 32 << 20;  // glibc's largest accepted value on 64-bit
  constexpr int kTrimThreshold = 256 << 20;
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace pipetrain::util
