// The matrix products of the engine's Linear fast path, on a choice of CPU kernels.
#include "pipetrain/runtime/gemm.h"

#include <torch/version.h>

#include <ATen/Context.h>

#include "pipetrain/error.h"
#include "pipetrain/runtime/small_gemm.h"

namespace pipetrain::runtime {

bool onednn_available() { return at::hasMKLDNN(); }

GemmKernel parse_gemm_kernel(const std::string& name) {
  if (name == "blas") return GemmKernel::Blas;
  if (name == "onednn") {
    if (!onednn_available()) {
      throw ConfigError("gemm kernel \"onednn\" requested but this LibTorch was built without "
                        "oneDNN (MKLDNN); use \"blas\" or \"auto\"");
    }
    return GemmKernel::OneDnn;
  }
  if (name == "native") {
    if (!native_gemm_available()) {
      throw ConfigError("gemm kernel \"native\" requested but its kernels (AVX-512F, or AVX2 and FMA) are off here: " +
                        native_gemm_summary() + "; use \"auto\", \"onednn\" or \"blas\"");
    }
    return GemmKernel::Native;
  }
  if (name == "auto") {
    if (native_gemm_available()) return GemmKernel::Native;
    return onednn_available() ? GemmKernel::OneDnn : GemmKernel::Blas;
  }
  throw ConfigError("unknown gemm kernel \"" + name + "\"; expected auto, native, onednn or blas");
}

std::string to_string(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::Native: return "native";
    case GemmKernel::OneDnn: return "onednn";
    default: return "blas";
  }
}

torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, GemmKernel kernel) {
  const bool dense_cpu_float = a.device().is_cpu() && b.device().is_cpu() &&
                               a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat &&
                               a.dim() == 2 && b.dim() == 2 && a.layout() == torch::kStrided &&
                               b.layout() == torch::kStrided;
  if (kernel == GemmKernel::Native) kernel = onednn_available() ? GemmKernel::OneDnn : GemmKernel::Blas;
  if (kernel == GemmKernel::Blas || !dense_cpu_float) return torch::mm(a, b);
#if TORCH_VERSION_MAJOR >= 2
  // On LibTorch 2.6 this primitive gave wrong weight gradients in a repeatable case
  // (DeferredLinearTest.AddsToAnExistingGradientAndLeavesAKeptOneAlone/onednn: 10.6 off at scale
  // 20.9 after a second, smaller micro-batch), while 1.13 passes; BLAS until it is understood.
  return torch::mm(a, b);
#endif
  // oneDNN's backward-data primitive of an inner product computes grad_output x weight for a
  // dense row-major weight (out x in): exactly A x B with "out" = K and "in" = N. It is the one
  // oneDNN product LibTorch 1.13 exposes on dense operands without a per-call weight reorder.
  const auto a_in = a.contiguous().to_mkldnn();
  const auto b_in = b.contiguous();
  return at::mkldnn_linear_backward_input({a.size(0), b.size(1)}, a_in, b_in).to_dense();
}

}  // namespace pipetrain::runtime
