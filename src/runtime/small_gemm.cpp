// AVX-512 kernels for few-row Linear products (why and how: small_gemm.h).
#include "pipetrain/runtime/small_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "pipetrain/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PIPETRAIN_HAVE_AVX512_KERNELS 1
#endif

namespace pipetrain::runtime {
namespace {

constexpr int64_t kPanel = PackedWeight::kPanel;
constexpr int kTileRows = 8;  // 8 x 32 accumulators: 16 of the 32 vector registers

// What the tile after this one reads, to prefetch (null: nothing).
struct Next {
  const float* a = nullptr;
  const float* b = nullptr;
};

#ifdef PIPETRAIN_HAVE_AVX512_KERNELS
// out[i][0..31] = sum_k a[i * lda + k] * bp[k][0..31] for i < MR: each step loads one 32-float
// row of the packed operand and broadcasts MR scalars of the other, 2 x MR FMAs.
// The operands of the next tile are prefetched into L2 alongside (next.a: its MR rows, the
// same stride; next.b: its packed panel): a 1024-float row is one 4 KiB page, where the
// hardware prefetcher stops, so a stage that streams 32 MiB of weights per micro-batch
// would otherwise wait on memory at every row.
template <int MR>
__attribute__((target("avx512f"))) void micro_tile(int64_t k_len, const float* a, int64_t lda, const float* bp,
                                                   float (*out)[kPanel], Next next) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < k_len; ++k) {
    if (next.a && k % 16 == 0) {
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) _mm_prefetch(reinterpret_cast<const char*>(next.a + i * lda + k), _MM_HINT_T1);
    }
    if (next.b) {
      _mm_prefetch(reinterpret_cast<const char*>(next.b + k * kPanel), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(next.b + k * kPanel + 16), _MM_HINT_T1);
    }
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

// The weight-gradient tile: acc[i][0..31] continues, over every part's rows in order,
//   acc[i][c] += dy^T[r0 + i][k] * x[k][col0 + c]
// with x packed once per micro-batch (WeightGradOperands) and dy read where it is (a transposed
// copy of dy measured no faster and costs a pass over it).
// The accumulators come from and go to dW itself (masked to the panel's columns): staging
// them in a buffer costs a store-forwarding stall per register, a third of a 32-row tile.
template <int MR>
__attribute__((target("avx512f"))) void weight_tile(const WeightGradOperands* const* parts, size_t num_parts,
                                                    int64_t r0, int64_t panel, float* dw, int64_t ldd,
                                                    __mmask16 m0, __mmask16 m1, bool fresh) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    c0[i] = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, dw + i * ldd);
    c1[i] = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, dw + i * ldd + 16);
  }
  for (size_t part = 0; part < num_parts; ++part) {
    const WeightGradOperands& op = *parts[part];
    const int64_t k_len = op.rows();
    const int64_t lda = op.out_features();
    const float* a = op.dy() + r0;  // dy^T[r0 + i][k] = dy[k][r0 + i]: 8 floats of one line per k
    const float* bp = op.x_panel(panel);
    for (int64_t k = 0; k < k_len; ++k) {
      const __m512 b0 = _mm512_loadu_ps(bp + k * kPanel);
      const __m512 b1 = _mm512_loadu_ps(bp + k * kPanel + 16);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 s = _mm512_set1_ps(a[k * lda + i]);
        c0[i] = _mm512_fmadd_ps(s, b0, c0[i]);
        c1[i] = _mm512_fmadd_ps(s, b1, c1[i]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(dw + i * ldd, m0, c0[i]);
    _mm512_mask_storeu_ps(dw + i * ldd + 16, m1, c1[i]);
  }
}

void weight_tile_rows(int rows, const WeightGradOperands* const* parts, size_t num_parts, int64_t r0, int64_t panel,
                      float* dw, int64_t ldd, int64_t cols, bool fresh) {
  const auto m0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  const auto m1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  switch (rows) {
    case 8: return weight_tile<8>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
    case 7: return weight_tile<7>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
    case 6: return weight_tile<6>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
    case 5: return weight_tile<5>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
    case 4: return weight_tile<4>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
    case 3: return weight_tile<3>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
    case 2: return weight_tile<2>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
    default: return weight_tile<1>(parts, num_parts, r0, panel, dw, ldd, m0, m1, fresh);
  }
}

void tile(int rows, int64_t k_len, const float* a, int64_t lda, const float* bp, float (*out)[kPanel],
          Next next = {}) {
  switch (rows) {
    case 8: return micro_tile<8>(k_len, a, lda, bp, out, next);
    case 7: return micro_tile<7>(k_len, a, lda, bp, out, next);
    case 6: return micro_tile<6>(k_len, a, lda, bp, out, next);
    case 5: return micro_tile<5>(k_len, a, lda, bp, out, next);
    case 4: return micro_tile<4>(k_len, a, lda, bp, out, next);
    case 3: return micro_tile<3>(k_len, a, lda, bp, out, next);
    case 2: return micro_tile<2>(k_len, a, lda, bp, out, next);
    default: return micro_tile<1>(k_len, a, lda, bp, out, next);
  }
}
#else
void tile(int, int64_t, const float*, int64_t, const float*, float (*)[kPanel], Next = {}) {
  TORCH_CHECK(false, "pipetrain's native GEMM kernels need an x86-64 build");
}
void weight_tile_rows(int, const WeightGradOperands* const*, size_t, int64_t, int64_t, float*, int64_t, int64_t,
                      bool) {
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

std::atomic<bool> native_disabled_{false};

bool cpu_has_avx512f() {
#ifdef PIPETRAIN_HAVE_AVX512_KERNELS
  static const bool available = __builtin_cpu_supports("avx512f");
  return available;
#else
  return false;
#endif
}

// The kernels' instructions exist only where the CPU has AVX-512F: anywhere else they are a
// SIGILL, so each public entry checks before it touches one.
void require_native(const char* who) {
  if (native_gemm_available()) return;
  throw ConfigError(std::string(who) + ": pipetrain's native GEMM kernels need AVX-512F, which " +
                    (cpu_has_avx512f() ? "is switched off (disable_native_gemm)" : "this CPU lacks") +
                    "; choose the kernel with parse_gemm_kernel(\"auto\") or use GemmKernel::Blas / OneDnn");
}

std::string sizes_of(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

// The kernels read raw float32 memory of CPU tensors; anything else is refused by name.
void require_float_cpu(const char* who, const char* name, const torch::Tensor& t, int64_t dims) {
  if (!t.defined() || t.dim() != dims || !t.device().is_cpu() || t.scalar_type() != torch::kFloat ||
      t.layout() != torch::kStrided) {
    throw BatchError(std::string(who) + ": " + name + " must be a dense float32 CPU tensor of " + std::to_string(dims) +
                     " dimension(s), got " +
                     (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + t.device().str() + " " +
                                        sizes_of(t)
                                  : std::string("an undefined tensor")));
  }
}

}  // namespace

bool native_gemm_available() { return cpu_has_avx512f() && !native_disabled_.load(); }

void disable_native_gemm(bool disabled) { native_disabled_.store(disabled); }

void PackedWeight::pack(const torch::Tensor& weight) {
  require_float_cpu("PackedWeight", "weight", weight, 2);
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

torch::Tensor native_linear(const torch::Tensor& x_in, const torch::Tensor& weight_in, const torch::Tensor& bias_in) {
  require_native("native_linear");
  require_float_cpu("native_linear", "x", x_in, 2);
  require_float_cpu("native_linear", "weight", weight_in, 2);
  if (bias_in.defined()) require_float_cpu("native_linear", "bias", bias_in, 1);
  if (x_in.size(1) != weight_in.size(1) || (bias_in.defined() && bias_in.size(0) != weight_in.size(0))) {
    throw BatchError("native_linear: x " + sizes_of(x_in) + ", weight " + sizes_of(weight_in) + " and bias " +
                     sizes_of(bias_in) + " do not fit y = x W^T + b (x: M x in, W: out x in, b: out)");
  }
  const auto x = x_in.contiguous();
  const auto weight = weight_in.contiguous();
  // Held for the whole product: a pointer into a temporary contiguous copy would dangle.
  const auto bias = bias_in.defined() ? bias_in.contiguous() : torch::Tensor();
  const int64_t m = x.size(0), k = x.size(1), out = weight.size(0);
  auto y = torch::empty({m, out}, x.options());
  if (m == 0) return y;
  const auto xt = pack_rows_transposed(x);
  const float* w = weight.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
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
      Next next;
      if (t + 1 < end && rows == kTileRows) next.a = w + (r0 + kTileRows) * k;
      for (int64_t p = 0; p < panels; ++p) {
        tile(rows, k, w + r0 * k, k, xp + p * k * kPanel, acc, p + 1 == panels ? next : Next{});
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
  require_native("native_input_grad");
  require_float_cpu("native_input_grad", "dy", dy_in, 2);
  if (!weight.defined() || dy_in.size(1) != weight.out_features()) {
    throw BatchError("native_input_grad: dy " + sizes_of(dy_in) + " needs a packed weight with " +
                     std::to_string(dy_in.size(1)) + " output features, got " +
                     (weight.defined() ? std::to_string(weight.out_features()) : std::string("an empty PackedWeight")));
  }
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
        Next next;
        if (r0 + kTileRows >= m && p + 1 < end) next.b = weight.panel(p + 1);
        tile(rows, k, a + r0 * k, k, weight.panel(p), acc, next);
        for (int i = 0; i < rows; ++i) std::copy(acc[i], acc[i] + cols, dst + (r0 + i) * in + p * kPanel);
      }
    }
  });
  return dx;
}

WeightGradOperands::WeightGradOperands(const torch::Tensor& dy_in, const torch::Tensor& x_in)
    : dy_(dy_in.defined() ? dy_in.contiguous() : dy_in), x_(x_in.defined() ? x_in.contiguous() : x_in) {
  require_float_cpu("WeightGradOperands", "dy", dy_, 2);
  require_float_cpu("WeightGradOperands", "x", x_, 2);
  if (dy_.size(0) != x_.size(0)) {
    throw BatchError("WeightGradOperands: dy " + sizes_of(dy_) + " and x " + sizes_of(x_) +
                     " must have the same rows (one per sample of the micro-batch)");
  }
  rows_ = dy_.size(0);
  out_ = dy_.size(1);
  in_ = x_.size(1);
  x_packed_.pack(x_);
  x_ptr_ = x_packed_.panel(0);
  dy_ptr_ = dy_.data_ptr<float>();
}

void native_weight_grad(float* dw, float* db, int64_t r_begin, int64_t r_end,
                        const std::vector<const WeightGradOperands*>& parts, bool fresh) {
  if (parts.empty()) return;
  require_native("native_weight_grad");
  if (!dw) throw UsageError("native_weight_grad: dw is null; pass the out x in gradient buffer");
  for (const auto* part : parts) {
    if (!part) throw UsageError("native_weight_grad: a null part; pass one WeightGradOperands per micro-batch");
  }
  const int64_t out = parts.front()->out_features(), in = parts.front()->in_features();
  for (const auto* part : parts) {
    if (part->out_features() != out || part->in_features() != in) {
      throw BatchError("native_weight_grad: parts of shapes " + std::to_string(part->out_features()) + "x" +
                       std::to_string(part->in_features()) + " and " + std::to_string(out) + "x" +
                       std::to_string(in) + " accumulate into one gradient; give every part the layer's shape");
    }
  }
  if (!(0 <= r_begin && r_begin <= r_end && r_end <= out)) {
    throw BatchError("native_weight_grad: rows [" + std::to_string(r_begin) + ", " + std::to_string(r_end) +
                     ") lie outside the gradient's 0.." + std::to_string(out));
  }
  const int64_t panels = (in + kPanel - 1) / kPanel;
  const int64_t tiles = (r_end - r_begin + kTileRows - 1) / kTileRows;
  // Panel-major: one panel of x stays in cache while the tiles of dy^T pass.
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t col0 = p * kPanel;
      const int64_t cols = std::min(kPanel, in - col0);
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r0 = r_begin + t * kTileRows;
        const int rows = static_cast<int>(std::min<int64_t>(kTileRows, r_end - r0));
        weight_tile_rows(rows, parts.data(), parts.size(), r0, p, dw + r0 * in + col0, in, cols, fresh);
      }
    }
  });
  if (!db) return;
  // Row by row in order, as the products: the same bits however the rows are split.
  if (fresh) std::fill(db + r_begin, db + r_end, 0.0f);
  for (const auto* part : parts) {
    const float* dy = part->dy();
    for (int64_t k = 0; k < part->rows(); ++k) {
      const float* g = dy + k * out;
      for (int64_t j = r_begin; j < r_end; ++j) db[j] += g[j];
    }
  }
}

}  // namespace pipetrain::runtime
