// Device-generic streams (see stream.h).
#include "pipetrain/runtime/stream.h"

#include <c10/core/impl/VirtualGuardImpl.h>

namespace pipetrain::runtime {

c10::Stream current_stream(torch::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

c10::Stream new_copy_stream(torch::Device device) {
  if (device.is_cpu()) return current_stream(device);  // one stream: nothing to overlap
  return c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
}

StreamScope::StreamScope(const c10::Stream& stream)
    : previous_(current_stream(stream.device())), previous_device_(stream.device()) {
  c10::impl::VirtualGuardImpl impl(stream.device_type());
  previous_device_ = impl.exchangeDevice(stream.device());
  impl.exchangeStream(stream);
}

StreamScope::~StreamScope() {
  c10::impl::VirtualGuardImpl impl(previous_.device_type());
  impl.exchangeStream(previous_);
  impl.uncheckedSetDevice(previous_device_);
}

void wait_stream(const c10::Stream& waiter, const c10::Stream& source) {
  if (waiter == source) return;
  c10::Event event(source.device_type());
  event.record(source);
  event.block(waiter);
}

void record_stream(const Batch& batch, const c10::Stream& stream) {
  c10::impl::VirtualGuardImpl impl(stream.device_type());
  for (const auto& t : batch.tensors()) {
    if (t.defined() && t.device() == stream.device()) impl.recordDataPtrOnStream(t.storage().data_ptr(), stream);
  }
}

}  // namespace pipetrain::runtime
