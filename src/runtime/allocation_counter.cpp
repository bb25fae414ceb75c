// Counts live CPU allocations through the allocator's memory reporting hook.
#include "pipetrain/runtime/allocation_counter.h"

#include "torch_compat.h"

namespace pipetrain::runtime {

struct AllocationCounter::Reporter : c10::MemoryReportingInfoBase {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};

  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, detail::MemoryTotal /*total_allocated*/,
                         detail::MemoryTotal /*total_reserved*/, c10::Device device) override {
    if (!device.is_cpu()) return;
    const int64_t now = live.fetch_add(alloc_size) + alloc_size;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

AllocationCounter::AllocationCounter() : reporter_(std::make_shared<Reporter>()) {
  guard_ = std::make_unique<c10::DebugInfoGuard>(c10::DebugInfoKind::PROFILER_STATE, reporter_);
}

AllocationCounter::~AllocationCounter() = default;

int64_t AllocationCounter::live_bytes() const { return reporter_->live.load(); }
int64_t AllocationCounter::peak_bytes() const { return reporter_->peak.load(); }
void AllocationCounter::reset_peak() { reporter_->peak.store(reporter_->live.load()); }

}  // namespace pipetrain::runtime
