// bf16 Linear kernels on AVX512_BF16 (why and how: small_gemm_bf16.h).
#include "pipetrain/runtime/small_gemm_bf16.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "pipetrain/error.h"
#include "pipetrain/runtime/small_gemm.h"
#include "small_gemm_checks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PIPETRAIN_HAVE_BF16_KERNELS 1
#endif

namespace pipetrain::runtime {
namespace {

constexpr int64_t kPanel = PackedPairs::kPanel;
constexpr int64_t kPairRow = 2 * kPanel;  // bf16 per pair row of a panel: 32 columns x 2
// Output rows per tile: 8 x 2 accumulators of the 32 registers, as the float32 AVX-512 tile.
constexpr int kRows = 8;

#ifdef PIPETRAIN_HAVE_BF16_KERNELS
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bf16")
// Deliberately no calls into std:: or torch:: here (small_gemm_tiles.inc says why).
namespace kernels {

[[gnu::always_inline]] inline __m512bh load_pairs(const uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(p));
}
[[gnu::always_inline]] inline __m512bh broadcast_pair(const uint16_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return (__m512bh)_mm512_set1_epi32(v);
}
// An odd reduction's last element, paired with a zero.
[[gnu::always_inline]] inline __m512bh broadcast_single(const uint16_t* p) {
  return (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(*p));
}
[[gnu::always_inline]] inline __mmask16 lanes(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1);
}

// What later tiles read, to prefetch into L2 (null: nothing): `a`, the next tile's MR rows (same
// stride); `b_rows` pair rows of a packed panel from `b`, one every 2^b_shift pairs of the tile.
struct Next {
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  int64_t b_rows = 0;
  int b_shift = 0;
};

// out[i * 32 + c] = sum_k a[i * lda + k] * S[k][c] for i < MR, c < 32, with `bp` one panel of
// a PackedPairs S: per pair of k, 2 loads of the panel, MR broadcasts and 2 x MR VDPBF16PS.
// What `next` names is prefetched alongside, as the float32 tile does and for the same reason.
template <int MR>
void tile(int64_t k_len, const uint16_t* a, int64_t lda, const uint16_t* bp, float* out, Next next) {
  __m512 c[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
  const int64_t pairs = k_len / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    if (next.a && j % 16 == 0) {
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) _mm_prefetch(reinterpret_cast<const char*>(next.a + i * lda + 2 * j), _MM_HINT_T1);
    }
    if (next.b && (j & ((int64_t{1} << next.b_shift) - 1)) == 0 && (j >> next.b_shift) < next.b_rows) {
      const uint16_t* row = next.b + (j >> next.b_shift) * kPairRow;
      _mm_prefetch(reinterpret_cast<const char*>(row), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(row + kPanel), _MM_HINT_T1);
    }
    const __m512bh b0 = load_pairs(bp + j * kPairRow), b1 = load_pairs(bp + j * kPairRow + kPanel);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh s = broadcast_pair(a + i * lda + 2 * j);
      c[i][0] = _mm512_dpbf16_ps(c[i][0], s, b0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], s, b1);
    }
  }
  if (k_len % 2) {  // the panel's pair row holds (S[k_len - 1][c], 0)
    const __m512bh b0 = load_pairs(bp + pairs * kPairRow), b1 = load_pairs(bp + pairs * kPairRow + kPanel);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh s = broadcast_single(a + i * lda + 2 * pairs);
      c[i][0] = _mm512_dpbf16_ps(c[i][0], s, b0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], s, b1);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm512_storeu_ps(out + i * kPanel, c[i][0]);
    _mm512_storeu_ps(out + i * kPanel + 16, c[i][1]);
  }
}

// dW rows r0 .. r0 + MR (within one 32-row panel of packed dy), the `cols` real columns of x's
// panel `panel`: continues the float32 sums in dw (or starts them at zero) over every part's
// row pairs in order. A ragged tile masks its loads and stores.
// The next tile's rows of dW (next_dw, same stride; null: none) are fetched meanwhile: dW rows
// lie 4 KiB apart, which no hardware prefetcher follows, and a stage's gradients (32 MiB) come
// from memory, so without it a third of the tile's time went to loading its accumulators.
template <int MR>
void weight_tile(const WeightGradPairs* const* parts, size_t num_parts, int64_t r0, int64_t panel, float* dw,
                 int64_t ldd, int64_t cols, bool fresh, float* next_dw, double* sq) {
  if (next_dw) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(next_dw + i * ldd), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(next_dw + i * ldd + 16), _MM_HINT_T0);
    }
  }
  const __mmask16 m0 = lanes(cols), m1 = lanes(cols - 16);
  __m512 c[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    c[i][0] = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, dw + i * ldd);
    c[i][1] = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, dw + i * ldd + 16);
  }
  for (size_t part = 0; part < num_parts; ++part) {
    const WeightGradPairs& op = *parts[part];
    const int64_t pairs = (op.rows() + 1) / 2;
    const uint16_t* a = op.dy_panel(r0 / kPanel) + 2 * (r0 % kPanel);
    const uint16_t* bp = op.x_panel(panel);
    for (int64_t j = 0; j < pairs; ++j) {
      const __m512bh b0 = load_pairs(bp + j * kPairRow), b1 = load_pairs(bp + j * kPairRow + kPanel);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512bh s = broadcast_pair(a + j * kPairRow + 2 * i);
        c[i][0] = _mm512_dpbf16_ps(c[i][0], s, b0);
        c[i][1] = _mm512_dpbf16_ps(c[i][1], s, b1);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(dw + i * ldd, m0, c[i][0]);
    _mm512_mask_storeu_ps(dw + i * ldd + 16, m1, c[i][1]);
  }
  if (sq) {  // the squares of what was stored, as the float32 tile sums them
    __m512 s = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 v0 = _mm512_maskz_mov_ps(m0, c[i][0]), v1 = _mm512_maskz_mov_ps(m1, c[i][1]);
      s = _mm512_fmadd_ps(v0, v0, s);
      s = _mm512_fmadd_ps(v1, v1, s);
    }
    alignas(64) float lanes16[16];
    _mm512_store_ps(lanes16, s);
    float total = 0.0f;
    for (int l = 0; l < 16; ++l) total += lanes16[l];
    *sq += total;
  }
}

template <int MR>
void tile_rows(int rows, int64_t k_len, const uint16_t* a, int64_t lda, const uint16_t* bp, float* out, Next next) {
  if constexpr (MR > 1) {
    if (rows < MR) return tile_rows<MR - 1>(rows, k_len, a, lda, bp, out, next);
  }
  tile<MR>(k_len, a, lda, bp, out, next);
}

template <int MR>
void weight_tile_rows(int rows, const WeightGradPairs* const* parts, size_t num_parts, int64_t r0, int64_t panel,
                      float* dw, int64_t ldd, int64_t cols, bool fresh, float* next_dw, double* sq) {
  if constexpr (MR > 1) {
    if (rows < MR)
      return weight_tile_rows<MR - 1>(rows, parts, num_parts, r0, panel, dw, ldd, cols, fresh, next_dw, sq);
  }
  weight_tile<MR>(parts, num_parts, r0, panel, dw, ldd, cols, fresh, next_dw, sq);
}

}  // namespace kernels
#pragma GCC pop_options
#endif

const uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); }

float to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

void require(const char* who, const char* name, const torch::Tensor& t, int64_t dims, c10::ScalarType dtype) {
  detail::require_dense_cpu(who, name, t, dims, dtype, dtype == torch::kFloat ? "float32" : "bfloat16");
}

using detail::sizes_of;

bool cpu_has_bf16() {
#ifdef PIPETRAIN_HAVE_BF16_KERNELS
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void require_bf16_kernels(const char* who) {
  if (native_bf16_available()) return;
  throw ConfigError(std::string(who) + ": the bf16 kernels need AVX-512F and AVX512_BF16 with the native kernels on "
                    "AVX-512; here they are " + native_gemm_summary() +
                    (cpu_has_bf16() ? "" : ", and this CPU lacks AVX512_BF16") +
                    "; check native_bf16_available() and use LibTorch's bf16 products otherwise");
}

}  // namespace

bool native_bf16_available() {
  return cpu_has_bf16() && native_gemm_available() && native_gemm_isa() == GemmIsa::Avx512;
}

void PackedPairs::pack(const uint16_t* src, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  const int64_t panels = (cols + kPanel - 1) / kPanel;
  const int64_t pairs = (rows + 1) / 2;
  if (!data_.defined() || data_.size(0) != panels || data_.size(1) != pairs) {
    data_ = torch::empty({panels, pairs, kPanel, 2}, torch::kBFloat16);
  }
  rows_ = rows;
  cols_ = cols;
  auto* dst = reinterpret_cast<uint16_t*>(data_.data_ptr<at::BFloat16>());
  ptr_ = dst;
  const int64_t whole_pairs = rows / 2;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t width = std::min(kPanel, cols - p * kPanel);
    uint16_t* panel = dst + p * pairs * kPairRow;
    const uint16_t* first = src + p * kPanel * col_stride;
    int64_t done = 0;  // pair rows written by a fast path
    if (row_stride == 1) {
      // x^T: a pair is two neighbours in memory; one 4-byte copy each, column by column (the
      // reads run along memory, the writes stride a pair row).
      for (int64_t c = 0; c < width; ++c) {
        const uint16_t* col = first + c * col_stride;
        for (int64_t j = 0; j < whole_pairs; ++j) std::memcpy(panel + j * kPairRow + 2 * c, col + 2 * j, 4);
      }
      for (int64_t j = 0; j < whole_pairs && width < kPanel; ++j) {
        std::fill(panel + j * kPairRow + 2 * width, panel + (j + 1) * kPairRow, uint16_t{0});
      }
      done = whole_pairs;
    } else if (col_stride == 1 && width == kPanel) {
      // W, dy, x: two rows interleaved, along memory.
      for (int64_t j = 0; j < whole_pairs; ++j) {
        uint16_t* d = panel + j * kPairRow;
        const uint16_t* r0 = first + 2 * j * row_stride;
        const uint16_t* r1 = r0 + row_stride;
        for (int64_t c = 0; c < kPanel; ++c) {
          d[2 * c] = r0[c];
          d[2 * c + 1] = r1[c];
        }
      }
      done = whole_pairs;
    }
    // Whatever is left (an odd last row, a ragged panel), element by element with zeros past the edges.
    for (int64_t j = done; j < pairs; ++j) {
      uint16_t* d = panel + j * kPairRow;
      const uint16_t* r0 = first + 2 * j * row_stride;
      const uint16_t* r1 = 2 * j + 1 < rows ? r0 + row_stride : nullptr;
      for (int64_t c = 0; c < kPanel; ++c) {
        d[2 * c] = c < width ? r0[c * col_stride] : 0;
        d[2 * c + 1] = c < width && r1 ? r1[c * col_stride] : 0;
      }
    }
  }
}

void PackedPairs::pack(const torch::Tensor& s_in, bool transposed) {
  require("PackedPairs", "the matrix", s_in, 2, torch::kBFloat16);
  const auto s = s_in.contiguous();
  if (transposed) {
    pack(bits(s), s.size(1), s.size(0), 1, s.size(1));
  } else {
    pack(bits(s), s.size(0), s.size(1), s.size(1), 1);
  }
}

torch::Tensor native_linear_bf16(const torch::Tensor& x_in, const torch::Tensor& weight_in, const torch::Tensor& bias_in) {
  require_bf16_kernels("native_linear_bf16");
  require("native_linear_bf16", "x", x_in, 2, torch::kBFloat16);
  require("native_linear_bf16", "weight", weight_in, 2, torch::kBFloat16);
  if (bias_in.defined()) require("native_linear_bf16", "bias", bias_in, 1, torch::kFloat);
  detail::check_linear_shapes("native_linear_bf16", x_in, weight_in, bias_in);
  const auto x = x_in.contiguous();
  const auto weight = weight_in.contiguous();
  const auto bias = bias_in.defined() ? bias_in.contiguous() : torch::Tensor();
  const int64_t m = x.size(0), k = x.size(1), out = weight.size(0);
  auto y = torch::empty({m, out}, x.options());
  if (m == 0) return y;
#ifdef PIPETRAIN_HAVE_BF16_KERNELS
  PackedPairs xt;
  xt.pack(x, /*transposed=*/true);
  const uint16_t* w = bits(weight);
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  auto* dst = reinterpret_cast<at::BFloat16*>(y.data_ptr<at::BFloat16>());
  const int64_t panels = (m + kPanel - 1) / kPanel;
  const int64_t tiles = (out + kRows - 1) / kRows;
  // y^T = W x^T: each tile is kRows output features x 32 rows of x, written back transposed.
  at::parallel_for(0, tiles, 8, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kRows][kPanel];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = t * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, out - r0));
      kernels::Next next;
      if (t + 1 < end && rows == kRows) next.a = w + (r0 + kRows) * k;
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t cols = std::min(kPanel, m - p * kPanel);
        kernels::tile_rows<kRows>(rows, k, w + r0 * k, k, xt.panel(p), &acc[0][0],
                                  p + 1 == panels ? next : kernels::Next{});
        for (int64_t c = 0; c < cols; ++c) {
          at::BFloat16* yrow = dst + (p * kPanel + c) * out + r0;
          for (int i = 0; i < rows; ++i) yrow[i] = at::BFloat16(acc[i][c] + (b ? b[r0 + i] : 0.0f));
        }
      }
    }
  });
#endif
  return y;
}

torch::Tensor native_input_grad_bf16(const torch::Tensor& dy_in, const PackedPairs& weight) {
  require_bf16_kernels("native_input_grad_bf16");
  require("native_input_grad_bf16", "dy", dy_in, 2, torch::kBFloat16);
  if (!weight.defined() || dy_in.size(1) != weight.rows()) {
    throw BatchError("native_input_grad_bf16: dy " + sizes_of(dy_in) + " needs a packed weight with " +
                     std::to_string(dy_in.size(1)) + " output features (rows), got " +
                     (weight.defined() ? std::to_string(weight.rows()) : std::string("an empty PackedPairs")));
  }
  const auto dy = dy_in.contiguous();
  const int64_t m = dy.size(0), k = weight.rows(), in = weight.cols();
  auto dx = torch::empty({m, in}, dy.options());
  if (m == 0) return dx;
#ifdef PIPETRAIN_HAVE_BF16_KERNELS
  const uint16_t* a = bits(dy);
  auto* dst = reinterpret_cast<at::BFloat16*>(dx.data_ptr<at::BFloat16>());
  const int64_t panels = (in + kPanel - 1) / kPanel;
  // The next panel's pair rows a share per tile, as in native_input_grad.
  const detail::PanelShares shares((k + 1) / 2, (m + kRows - 1) / kRows);
  at::parallel_for(0, panels, 4, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kRows][kPanel];
    for (int64_t p = begin; p < end; ++p) {
      const int64_t cols = std::min(kPanel, in - p * kPanel);
      int64_t fetched = 0;  // pair rows of the next panel asked for so far
      for (int64_t r0 = 0; r0 < m; r0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
        kernels::Next next;
        if (p + 1 < end && fetched < shares.rows) {
          next.b = weight.panel(p + 1) + fetched * kPairRow;
          next.b_shift = shares.shift;
          next.b_rows = shares.take(fetched);
        }
        kernels::tile_rows<kRows>(rows, k, a + r0 * k, k, weight.panel(p), &acc[0][0], next);
        for (int i = 0; i < rows; ++i) {
          at::BFloat16* row = dst + (r0 + i) * in + p * kPanel;
          for (int64_t c = 0; c < cols; ++c) row[c] = at::BFloat16(acc[i][c]);
        }
      }
    }
  });
#endif
  return dx;
}

WeightGradPairs::WeightGradPairs(const torch::Tensor& dy_in, const torch::Tensor& x_in) {
  require("WeightGradPairs", "dy", dy_in, 2, torch::kBFloat16);
  require("WeightGradPairs", "x", x_in, 2, torch::kBFloat16);
  if (dy_in.size(0) != x_in.size(0)) {
    throw BatchError("WeightGradPairs: dy " + sizes_of(dy_in) + " and x " + sizes_of(x_in) +
                     " must have the same rows (one per sample of the micro-batch)");
  }
  dy_ = dy_in.contiguous();
  rows_ = dy_.size(0);
  out_ = dy_.size(1);
  in_ = x_in.size(1);
  dy_packed_.pack(dy_);
  x_packed_.pack(x_in);
  dy_ptr_ = bits(dy_);
}

void native_weight_grad_bf16(float* dw, float* db, int64_t r_begin, int64_t r_end,
                             const std::vector<const WeightGradPairs*>& parts, bool fresh, double* sqnorm) {
  if (parts.empty()) {
    if (sqnorm) throw BatchError("native_weight_grad_bf16: a sum of squares (sqnorm) needs at least one part");
    return;
  }
  require_bf16_kernels("native_weight_grad_bf16");
  detail::check_weight_grad_call("native_weight_grad_bf16", "WeightGradPairs", dw, parts, r_begin, r_end);
  const int64_t out = parts.front()->out_features(), in = parts.front()->in_features();
#ifdef PIPETRAIN_HAVE_BF16_KERNELS
  const int64_t panels = (in + kPanel - 1) / kPanel;
  std::vector<double> panel_sq(sqnorm ? static_cast<size_t>(panels) : 0, 0.0);  // added in order below
  // Panel-major: one panel of x stays in cache while the tiles of dy^T pass.
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t col0 = p * kPanel;
      for (int64_t r0 = r_begin; r0 < r_end;) {
        const int64_t panel_end = std::min(r_end, (r0 / kPanel + 1) * kPanel);
        const int rows = static_cast<int>(std::min<int64_t>(kRows, panel_end - r0));
        // The next tile: the rows below in this panel, else the top of the next panel.
        float* next = r0 + rows < r_end ? dw + (r0 + rows) * in + col0
                      : p + 1 < end     ? dw + r_begin * in + col0 + kPanel
                                        : nullptr;
        kernels::weight_tile_rows<kRows>(rows, parts.data(), parts.size(), r0, p, dw + r0 * in + col0, in,
                                         std::min(kPanel, in - col0), fresh, next,
                                         sqnorm ? &panel_sq[static_cast<size_t>(p)] : nullptr);
        r0 += rows;
      }
    }
  });
#endif
  if (sqnorm) {
    *sqnorm = 0.0;
    for (const double v : panel_sq) *sqnorm += v;
  }
  if (!db) return;
  // Row by row in order, as the products: the same bits however the rows are split.
  if (fresh) std::fill(db + r_begin, db + r_end, 0.0f);
  for (const auto* part : parts) {
    const uint16_t* dy = part->dy();
    for (int64_t k = 0; k < part->rows(); ++k) {
      const uint16_t* g = dy + k * out;
      for (int64_t j = r_begin; j < r_end; ++j) db[j] += to_float(g[j]);
    }
  }
}

}  // namespace pipetrain::runtime
