// libxsmm 1.17's JIT GEMM kernels (fp32, and bf16 in / fp32 out) as row-major products.
//
// libxsmm is column-major: C (m x n) = A (m x k) B (k x n). A row-major product
// out (n x m) = L (n x k) R (k x m) is the same memory read column-major as out^T = R^T L^T, so
// each kernel here runs libxsmm with A = R, B = L, C = out and no copy:
//   forward      y  = x W^T    L = x,    R = W^T (1.17 cannot transpose A: W^T is materialised)
//   input grad   dx = dy W     L = dy,   R = W
//   weight grad  dW = dy^T x   L = dy^T, R = x (fp32: L read as dy through TRANS_B)
// The bf16 kernels want R in "VNNI" pairs: R (k x m) stored as (k/2, m, 2), the two k of a
// pair side by side for VDPBF16PS (lay_out below). libxsmm's target is fixed by the
// environment (LIBXSMM_TARGET=hsw: AVX2 code) before the first dispatch.
#pragma once

#include <libxsmm.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace pipetrain::bench {

inline const char* xsmm_target() {
  libxsmm_init();
  return libxsmm_get_target_arch();
}

// out (n x m) = L (n x k) R (k x m), float32; `l_transposed`: L is given as L^T (k x n).
class XsmmF32 {
 public:
  XsmmF32(int64_t n, int64_t k, int64_t m, bool l_transposed) {
    libxsmm_init();
    const libxsmm_blasint lda = m, ldb = l_transposed ? n : k, ldc = m;
    const float alpha = 1, beta = 0;
    const int flags = l_transposed ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
    fn_ = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, nullptr);
  }
  bool ok() const { return fn_ != nullptr; }
  void operator()(const float* l, const float* r, float* out) const { fn_(r, l, out); }

 private:
  libxsmm_smmfunction fn_ = nullptr;
};

// out (n x m, float32) = L (n x k, bf16) R (k x m, bf16 in VNNI pairs), accumulated in float32.
class XsmmBf16 {
 public:
  XsmmBf16(int64_t n, int64_t k, int64_t m) {
    libxsmm_init();
    const libxsmm_blasint lda = m, ldb = k, ldc = m;
    const float alpha = 1, beta = 0;
    const int flags = LIBXSMM_GEMM_FLAG_VNNI_A;
    fn_ = libxsmm_bsmmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, nullptr);
  }
  bool ok() const { return fn_ != nullptr; }
  void operator()(const at::BFloat16* l, const at::BFloat16* r, float* out) const {
    fn_(reinterpret_cast<const libxsmm_bfloat16*>(r), reinterpret_cast<const libxsmm_bfloat16*>(l), out);
  }

 private:
  libxsmm_bsmmfunction fn_ = nullptr;
};

// dst[p_offset(p) + i * i_step] = src(p, i) for a k x m view with any strides, in 8 x 8 tiles
// so that reads and writes both stay in cache whichever of the two is strided.
template <typename Dst, typename Src, typename Offset>
void copy_tiled(int64_t k, int64_t m, const Src* src, int64_t s0, int64_t s1, Dst* dst, Offset p_offset,
                int64_t i_step) {
  constexpr int64_t kTile = 8;
  for (int64_t p0 = 0; p0 < k; p0 += kTile) {
    for (int64_t i0 = 0; i0 < m; i0 += kTile) {
      const int64_t i1 = std::min(m, i0 + kTile);
      for (int64_t p = p0; p < std::min(k, p0 + kTile); ++p) {
        const Src* in = src + p * s0;
        Dst* out = dst + p_offset(p);
        for (int64_t i = i0; i < i1; ++i) out[i * i_step] = Dst(in[i * s1]);
      }
    }
  }
}

// `src` (k x m view, float32 or bf16) into `out` (allocated on first use, contiguous), as Dst:
// pairs = true lays it out in VNNI pairs ((k/2) x m x 2), else plain k x m (a transpose when
// src is a transposed view). One pass: the per-step preparation of a weight or activation.
template <typename Dst>
void lay_out(const torch::Tensor& src, torch::Tensor& out, bool pairs) {
  const int64_t k = src.size(0), m = src.size(1);
  TORCH_CHECK_VALUE(!pairs || k % 2 == 0, "VNNI pairs need an even k, got ", k);
  const auto dtype = std::is_same<Dst, float>::value ? torch::kFloat : torch::kBFloat16;
  if (!out.defined()) out = pairs ? torch::empty({k / 2, m, 2}, dtype) : torch::empty({k, m}, dtype);
  Dst* dst = out.data_ptr<Dst>();
  const auto p_offset = [m, pairs](int64_t p) { return pairs ? (p / 2) * m * 2 + p % 2 : p * m; };
  const int64_t i_step = pairs ? 2 : 1;
  if (src.scalar_type() == torch::kFloat) {
    copy_tiled(k, m, src.data_ptr<float>(), src.stride(0), src.stride(1), dst, p_offset, i_step);
  } else {
    TORCH_CHECK_TYPE(src.scalar_type() == torch::kBFloat16, "lay_out takes float32 or bfloat16, got ", src.scalar_type());
    copy_tiled(k, m, src.data_ptr<at::BFloat16>(), src.stride(0), src.stride(1), dst, p_offset, i_step);
  }
}

}  // namespace pipetrain::bench
