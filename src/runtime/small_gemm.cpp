// AVX-512 kernels for few-row Linear products (why and how: small_gemm.h).
#include "pipetrain/runtime/small_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PIPETRAIN_HAVE_AVX512_KERNELS 1
#endif

namespace pipetrain::runtime {
namespace {

constexpr int64_t kPanel = PackedWeight::kPanel;
constexpr int kTileRows = 8;  // 8 x 32 accumulators: 16 of the 32 vector registers

#ifdef PIPETRAIN_HAVE_AVX512_KERNELS
// out[i][0..31] = sum_k a[i * lda + k] * bp[k][0..31] for i < MR: each step loads one 32-float
// row of the packed operand and broadcasts MR scalars of the other, 2 x MR FMAs.
template <int MR>
__attribute__((target("avx512f"))) void micro_tile(int64_t k_len, const float* a, int64_t lda, const float* bp,
                                                   float (*out)[kPanel]) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < k_len; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * kPanel);
    const __m512 b1 = _mm512_loadu_ps(bp + k * kPanel + 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 s = _mm512_set1_ps(a[i * lda + k]);
      c0[i] = _mm512_fmadd_ps(s, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(s, b1, c1[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm512_storeu_ps(out[i], c0[i]);
    _mm512_storeu_ps(out[i] + 16, c1[i]);
  }
}

void tile(int rows, int64_t k_len, const float* a, int64_t lda, const float* bp, float (*out)[kPanel]) {
  switch (rows) {
    case 8: return micro_tile<8>(k_len, a, lda, bp, out);
    case 7: return micro_tile<7>(k_len, a, lda, bp, out);
    case 6: return micro_tile<6>(k_len, a, lda, bp, out);
    case 5: return micro_tile<5>(k_len, a, lda, bp, out);
    case 4: return micro_tile<4>(k_len, a, lda, bp, out);
    case 3: return micro_tile<3>(k_len, a, lda, bp, out);
    case 2: return micro_tile<2>(k_len, a, lda, bp, out);
    default: return micro_tile<1>(k_len, a, lda, bp, out);
  }
}
#else
void tile(int, int64_t, const float*, int64_t, const float*, float (*)[kPanel]) {
  TORCH_CHECK(false, "pipetrain's native GEMM kernels need an x86-64 build");
}
#endif

// Panels of 32 rows of x laid out k-major ([K][32]), zero-padded past the last row.
torch::Tensor pack_rows_transposed(const torch::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t panels = (m + kPanel - 1) / kPanel;
  auto packed = torch::zeros({panels, k, kPanel}, x.options());
  const float* src = x.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t rows = std::min(kPanel, m - p * kPanel);
    float* panel = dst + p * k * kPanel;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = src + (p * kPanel + r) * k;
      for (int64_t j = 0; j < k; ++j) panel[j * kPanel + r] = row[j];
    }
  }
  return packed;
}

}  // namespace

bool native_gemm_available() {
#ifdef PIPETRAIN_HAVE_AVX512_KERNELS
  static const bool available = __builtin_cpu_supports("avx512f");
  return available;
#else
  return false;
#endif
}

void PackedWeight::pack(const torch::Tensor& weight) {
  const auto w = weight.detach().contiguous();
  out_ = w.size(0);
  in_ = w.size(1);
  const int64_t panels = (in_ + kPanel - 1) / kPanel;
  if (!data_.defined() || data_.size(0) != panels || data_.size(1) != out_ || data_.dtype() != w.dtype()) {
    data_ = torch::empty({panels, out_, kPanel}, w.options());
  }
  const float* src = w.data_ptr<float>();
  float* dst = data_.data_ptr<float>();
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = std::min(kPanel, in_ - p * kPanel);
    float* panel = dst + p * out_ * kPanel;
    for (int64_t r = 0; r < out_; ++r) {
      const float* row = src + r * in_ + p * kPanel;
      std::copy(row, row + cols, panel + r * kPanel);
      std::fill(panel + r * kPanel + cols, panel + (r + 1) * kPanel, 0.0f);
    }
  }
}

torch::Tensor native_linear(const torch::Tensor& x_in, const torch::Tensor& weight_in, const torch::Tensor& bias) {
  const auto x = x_in.contiguous();
  const auto weight = weight_in.contiguous();
  const int64_t m = x.size(0), k = x.size(1), out = weight.size(0);
  auto y = torch::empty({m, out}, x.options());
  if (m == 0) return y;
  const auto xt = pack_rows_transposed(x);
  const float* w = weight.data_ptr<float>();
  const float* b = bias.defined() ? bias.contiguous().data_ptr<float>() : nullptr;
  const float* xp = xt.data_ptr<float>();
  float* dst = y.data_ptr<float>();
  const int64_t panels = xt.size(0);
  const int64_t tiles = (out + kTileRows - 1) / kTileRows;
  // y^T = W x^T: each tile is 8 output features x 32 rows, written back transposed.
  at::parallel_for(0, tiles, 8, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kTileRows][kPanel];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = t * kTileRows;
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, out - r0));
      for (int64_t p = 0; p < panels; ++p) {
        tile(rows, k, w + r0 * k, k, xp + p * k * kPanel, acc);
        const int64_t cols = std::min(kPanel, m - p * kPanel);
        for (int64_t c = 0; c < cols; ++c) {
          float* yrow = dst + (p * kPanel + c) * out + r0;
          for (int i = 0; i < rows; ++i) yrow[i] = acc[i][c] + (b ? b[r0 + i] : 0.0f);
        }
      }
    }
  });
  return y;
}

torch::Tensor native_input_grad(const torch::Tensor& dy_in, const PackedWeight& weight) {
  const auto dy = dy_in.contiguous();
  const int64_t m = dy.size(0), k = weight.out_features(), in = weight.in_features();
  auto dx = torch::empty({m, in}, dy.options());
  if (m == 0) return dx;
  const float* a = dy.data_ptr<float>();
  float* dst = dx.data_ptr<float>();
  const int64_t panels = (in + kPanel - 1) / kPanel;
  at::parallel_for(0, panels, 4, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kTileRows][kPanel];
    for (int64_t p = begin; p < end; ++p) {
      const int64_t cols = std::min(kPanel, in - p * kPanel);
      for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m - r0));
        tile(rows, k, a + r0 * k, k, weight.panel(p), acc);
        for (int i = 0; i < rows; ++i) std::copy(acc[i], acc[i] + cols, dst + (r0 + i) * in + p * kPanel);
      }
    }
  });
  return dx;
}

}  // namespace pipetrain::runtime
