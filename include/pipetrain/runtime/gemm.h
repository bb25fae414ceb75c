// The matrix products of the engine's Linear fast path, on a choice of CPU kernels.
//
// Debian's LibTorch runs nn::Linear on whatever libblas.so.3 the system has. Its oneDNN build
// has a second GEMM: on the AVX-512 machines we run on it is about 2x faster than OpenBLAS for
// the 32-row products a pipeline's micro-batches make, because it does not re-pack the
// 1024x1024 weight for every small product. The engine picks a kernel once ("auto": oneDNN
// where LibTorch has it) and `pipetrain bench` reports the plain loop with both kernels.
#pragma once

#include <torch/torch.h>

#include <string>

namespace pipetrain::runtime {

enum class GemmKernel { Blas, OneDnn };

// "blas", "onednn", or "auto" (oneDNN when LibTorch was built with it, else BLAS).
// ConfigError for anything else, or for "onednn" where LibTorch lacks it.
GemmKernel parse_gemm_kernel(const std::string& name);
std::string to_string(GemmKernel kernel);
bool onednn_available();

// C = A x B for dense, 2-D, CPU float32 A (M x K) and B (K x N); A and B may be
// non-contiguous views (they are made contiguous where the kernel needs it). Other
// devices and dtypes take torch::mm whatever the kernel.
torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, GemmKernel kernel);

}  // namespace pipetrain::runtime
