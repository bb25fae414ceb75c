// Counts the bytes of CPU tensor storage allocated while a counter is installed and still alive:
// the real storage a forward pass leaves behind for backward (activations saved by autograd
// or by a checkpoint), not an estimate.
//
// It hooks LibTorch's CPU allocator reporting (c10::MemoryReportingInfoBase, the mechanism of
// the profiler's memory view), installed as thread-local debug info. That info travels with
// at::ThreadLocalState, so GPipe's workers, which run under the caller's state, are counted
// too. Allocations made before installation are ignored, also when freed. Not for use together
// with the autograd profiler (both use the same slot).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <cstdint>
#include <memory>

namespace pipetrain::runtime {

class AllocationCounter {
 public:
  AllocationCounter();
  ~AllocationCounter();
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  // Bytes allocated since installation and not freed yet.
  int64_t live_bytes() const;
  // The highest live_bytes() seen.
  int64_t peak_bytes() const;
  // Starts a new peak from the current live bytes.
  void reset_peak();

 private:
  struct Reporter;
  std::shared_ptr<Reporter> reporter_;
  std::unique_ptr<c10::DebugInfoGuard> guard_;
};

}  // namespace pipetrain::runtime
