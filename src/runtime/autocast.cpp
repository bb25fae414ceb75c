// Autocast settings across LibTorch versions: 1.13 names them per device (set_cpu_enabled),
// 2.x takes a device type (set_autocast_enabled) and deprecates the old names.
#include "pipetrain/runtime/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

#if TORCH_VERSION_MAJOR >= 2
bool enabled(c10::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
void set_enabled(c10::DeviceType t, bool on) { at::autocast::set_autocast_enabled(t, on); }
c10::ScalarType dtype_of(c10::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
void set_dtype(c10::DeviceType t, c10::ScalarType d) { at::autocast::set_autocast_dtype(t, d); }
#else
bool enabled(c10::DeviceType t) {
  return t == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_enabled(c10::DeviceType t, bool on) {
  if (t == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
c10::ScalarType dtype_of(c10::DeviceType t) {
  return t == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_dtype(c10::DeviceType t, c10::ScalarType d) {
  if (t == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(d);
  } else {
    at::autocast::set_autocast_cpu_dtype(d);
  }
}
#endif

}  // namespace

c10::ScalarType compute_dtype(const std::string& precision) {
  if (precision == "fp32") return c10::ScalarType::Float;
  if (precision == "bf16") return c10::ScalarType::BFloat16;
  if (precision == "fp16") return c10::ScalarType::Half;
  throw ConfigError("precision \"" + precision + "\" is not one of fp32, bf16, fp16");
}

bool low_precision_supported(torch::Device device, c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::Float) return true;
  try {
    AutocastScope scope(device, dtype);
    // No torch::nn::Linear: its initialisation would draw from the default generator.
    const auto options = torch::TensorOptions().device(device);
    auto w = torch::full({4, 4}, 0.5, options).requires_grad_(true);
    auto y = torch::relu(torch::nn::functional::linear(torch::ones({2, 4}, options), w));
    if (y.scalar_type() != dtype) return false;
    y.sum().backward();
    return w.grad().defined() && w.grad().scalar_type() == c10::ScalarType::Float;
  } catch (const c10::Error&) {
    return false;  // "not implemented for 'Half'" and the like
  }
}

c10::ScalarType autocast_dtype(torch::Device device) {
  const auto type = device.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  return enabled(type) ? dtype_of(type) : c10::ScalarType::Float;
}

AutocastState AutocastState::current() {
  AutocastState s;
  s.cpu_enabled = enabled(c10::DeviceType::CPU);
  s.cpu_dtype = dtype_of(c10::DeviceType::CPU);
  s.cuda_enabled = enabled(c10::DeviceType::CUDA);
  s.cuda_dtype = dtype_of(c10::DeviceType::CUDA);
  return s;
}

void AutocastState::apply() const {
  set_dtype(c10::DeviceType::CPU, cpu_dtype);
  set_enabled(c10::DeviceType::CPU, cpu_enabled);
  set_dtype(c10::DeviceType::CUDA, cuda_dtype);
  set_enabled(c10::DeviceType::CUDA, cuda_enabled);
}

NoCastCacheScope::NoCastCacheScope() : previous_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(false);
}

NoCastCacheScope::~NoCastCacheScope() { at::autocast::set_autocast_cache_enabled(previous_); }

AutocastScope::AutocastScope(torch::Device device, c10::ScalarType dtype) : previous_(AutocastState::current()) {
  const auto type = device.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  // set_dtype throws where this LibTorch refuses the dtype (1.13: float16 on the CPU); the
  // nesting count goes up only once nothing can throw, or it would leak and the cast cache
  // would never be cleared again on this thread (stale weights in every later step).
  if (dtype == c10::ScalarType::Float) {
    set_enabled(type, false);
  } else {
    set_dtype(type, dtype);
    set_enabled(type, true);
  }
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  previous_.apply();
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // namespace pipetrain::runtime
