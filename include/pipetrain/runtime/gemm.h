// The matrix products of the engine's Linear fast path, on a choice of CPU kernels.
//
// Debian's LibTorch runs nn::Linear on whatever libblas.so.3 the system has. Its oneDNN build
// has a second GEMM, faster than OpenBLAS for the 32-row products a pipeline's micro-batches
// make, and pipetrain has its own AVX-512 and AVX2 kernels for those (small_gemm.h), about 2x
// faster than OpenBLAS there. The engine picks a kernel once ("auto": native where the CPU has
// AVX-512 or AVX2 with FMA, else oneDNN where LibTorch has it, else BLAS).
#pragma once

#include <torch/torch.h>

#include <string>

namespace pipetrain::runtime {

enum class GemmKernel { Blas, OneDnn, Native };

// "blas", "onednn", "native", or "auto" (native on AVX-512 or AVX2 CPUs, else oneDNN when LibTorch
// was built with it, else BLAS). ConfigError for anything else, or for a kernel this machine
// lacks.
GemmKernel parse_gemm_kernel(const std::string& name);
std::string to_string(GemmKernel kernel);
bool onednn_available();

// C = A x B for dense, 2-D, CPU float32 A (M x K) and B (K x N); A and B may be
// non-contiguous views (they are made contiguous where the kernel needs it). Other
// devices and dtypes take torch::mm whatever the kernel. Native serves only the Linear
// products of small_gemm.h; here it means the best general kernel (oneDNN, else BLAS).
torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, GemmKernel kernel);

}  // namespace pipetrain::runtime
