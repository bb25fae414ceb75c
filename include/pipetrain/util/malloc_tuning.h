// Keeps freed activation buffers in the heap instead of returning them to the kernel.
#pragma once

namespace pipetrain::util {

// glibc serves blocks above its mmap threshold (128 KiB until a large block is freed) with
// fresh mmaps and unmaps them on free, so a training step that allocates the same activation
// sizes every micro-batch page-faults them in again each time. On a VM that is most of the
// time: the cnn example's reference run took 4x longer. This raises the threshold to glibc's
// maximum (32 MiB) and the trim threshold to 256 MiB. Call once, early, in a program's main;
// the `pipetrain` tool does. A no-op with other C libraries; returns whether it applied.
bool tune_malloc_for_training();

}  // namespace pipetrain::util
