// Mixed-precision compute through LibTorch's autocast: matrix products and convolutions run in
// bfloat16 or float16 while parameters (and so their gradients and the optimizer) stay float32,
// as torch.autocast does. Autocast is per thread: whoever runs a stage's ops enters the scope.
#pragma once

#include <torch/torch.h>

#include <string>

namespace pipetrain::runtime {

// "fp32" -> Float, "bf16" -> BFloat16, "fp16" -> Half; ConfigError otherwise.
c10::ScalarType compute_dtype(const std::string& precision);

// Whether this LibTorch computes in `dtype` on `device` (a trial Linear forward and backward
// under autocast): bfloat16 on CPUs, float16 on CPUs only from LibTorch 2.x, both on CUDA.
bool low_precision_supported(torch::Device device, c10::ScalarType dtype);

// What autocast makes a Linear on `device` compute in on this thread: its dtype when autocast
// is on for that device type, else Float.
c10::ScalarType autocast_dtype(torch::Device device);

// The autocast settings of the calling thread for the CPU and CUDA.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;

  static AutocastState current();
  void apply() const;
};

// Applies `state` for a scope (a worker running its caller's ops, a recomputation) and puts the
// thread's own settings back afterwards.
class AutocastStateScope {
 public:
  explicit AutocastStateScope(const AutocastState& state) : saved_(AutocastState::current()) { state.apply(); }
  ~AutocastStateScope() { saved_.apply(); }
  AutocastStateScope(const AutocastStateScope&) = delete;
  AutocastStateScope& operator=(const AutocastStateScope&) = delete;

 private:
  AutocastState saved_;
};

// Autocast's cache of cast weights off for the scope. Where a cast could outlive the weights it
// copies (a thread that never leaves autocast's outermost scope, so never clears the cache) or
// be made under no_grad and reused with grad (a checkpoint's first forward, then its
// recomputation: the float32 weight would get no gradient; LibTorch 1.13 caches regardless of
// grad mode).
class NoCastCacheScope {
 public:
  NoCastCacheScope();
  ~NoCastCacheScope();
  NoCastCacheScope(const NoCastCacheScope&) = delete;
  NoCastCacheScope& operator=(const NoCastCacheScope&) = delete;

 private:
  bool previous_;
};

// Autocast to `dtype` on `device`'s type for the scope (Float: autocast off); the thread's
// previous settings come back at the end, and the outermost scope drops autocast's cache of
// cast weights (they change with each optimizer step).
class AutocastScope {
 public:
  AutocastScope(torch::Device device, c10::ScalarType dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
};

}  // namespace pipetrain::runtime
