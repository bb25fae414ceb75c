// Device-generic streams: CUDA streams on CUDA, the CPU's single no-op stream elsewhere.
//
// Written against c10::Stream, c10::Event and c10::impl::VirtualGuardImpl, so that the same
// pipeline code builds and runs (as no-ops) in a CPU-only LibTorch, where CI covers it. The
// discipline is torchgpipe's: a partition's activations cross to the next device on a copy
// stream of their own; the consumer waits for the copy (an event recorded on one stream,
// blocked on by the other) and the allocator is told which streams still use each tensor
// (record_stream), so nothing is freed while a copy reads it.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/torch.h>

#include "pipetrain/batch/batch.h"

namespace pipetrain::runtime {

// The stream that kernels launched now on `device` go to.
c10::Stream current_stream(torch::Device device);
// A stream for copies: one from the device's pool where it has several (CUDA), the current
// stream where it has one (the CPU).
c10::Stream new_copy_stream(torch::Device device);

// Makes `stream` current on its device for the scope (and its device current).
class StreamScope {
 public:
  explicit StreamScope(const c10::Stream& stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  c10::Stream previous_;
  c10::Device previous_device_;
};

// Work queued on `waiter` after this call starts once the work queued on `source` so far is
// done (nothing to do when they are one stream).
void wait_stream(const c10::Stream& waiter, const c10::Stream& source);

// The allocator keeps the tensors' memory until the work queued on `stream` so far is done
// (torch's Tensor.record_stream; nothing on the CPU).
void record_stream(const Batch& batch, const c10::Stream& stream);

}  // namespace pipetrain::runtime
