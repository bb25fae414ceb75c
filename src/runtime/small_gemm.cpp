// AVX-512 and AVX2 kernels for few-row Linear products (why and how: small_gemm.h).
#include "pipetrain/runtime/small_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "pipetrain/error.h"
#include "small_gemm_checks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PIPETRAIN_HAVE_NATIVE_KERNELS 1
#endif

namespace pipetrain::runtime {
namespace {

constexpr int64_t kPanel = PackedWeight::kPanel;
constexpr int kMaxTileRows = 8;  // the most rows of any instruction set's tile

// What later tiles read, to prefetch (null: nothing): `a`, the next tile's rows; `b_rows` rows
// of a packed panel from `b`, one every 2^b_shift steps of the tile.
struct Next {
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t b_rows = 0;
  int b_shift = 0;
};

// One instruction set's tiles (small_gemm_tiles.inc), as the shared drivers below call them:
// `rows` x `cols` outputs per call, `cols` dividing the 32-wide panel.
struct Tiles {
  int rows;
  int cols;
  // out[i * kPanel + c] for i < rows (at most Tiles::rows), c < cols
  void (*tile)(int rows, int64_t k_len, const float* a, int64_t lda, const float* bp, float* out, Next next);
  // dW rows [r0, r0 + rows), columns [col0, col0 + cols) of panel `panel` (cols: how many are real)
  void (*weight_tile)(int rows, const WeightGradOperands* const* parts, size_t num_parts, int64_t r0, int64_t panel,
                      int64_t col0, float* dw, int64_t ldd, int64_t cols, bool fresh, const float* next_dw,
                      double* sq);
};

#ifdef PIPETRAIN_HAVE_NATIVE_KERNELS
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
struct Vec {
  using Reg = __m512;
  using Mask = __mmask16;
  static constexpr int kWidth = 16, kVecs = 2, kRows = 8;  // 16 of the 32 registers accumulate
  [[gnu::always_inline]] static inline Reg zero() { return _mm512_setzero_ps(); }
  [[gnu::always_inline]] static inline Reg load(const float* p) { return _mm512_loadu_ps(p); }
  [[gnu::always_inline]] static inline void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  [[gnu::always_inline]] static inline Reg broadcast(float f) { return _mm512_set1_ps(f); }
  [[gnu::always_inline]] static inline Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  // The first `lanes` lanes (none for lanes <= 0, all for lanes >= kWidth).
  [[gnu::always_inline]] static inline Mask mask(int64_t lanes) {
    return static_cast<Mask>(lanes >= kWidth ? 0xFFFF : lanes <= 0 ? 0 : (1u << lanes) - 1);
  }
  [[gnu::always_inline]] static inline Reg load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  [[gnu::always_inline]] static inline void store(float* p, Mask m, Reg v) { _mm512_mask_storeu_ps(p, m, v); }
  [[gnu::always_inline]] static inline Reg keep(Reg v, Mask m) { return _mm512_maskz_mov_ps(m, v); }
};
#include "small_gemm_tiles.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
struct Vec {
  using Reg = __m256;
  using Mask = __m256i;
  static constexpr int kWidth = 8, kVecs = 2, kRows = 6;  // 12 of the 16 registers accumulate
  [[gnu::always_inline]] static inline Reg zero() { return _mm256_setzero_ps(); }
  [[gnu::always_inline]] static inline Reg load(const float* p) { return _mm256_loadu_ps(p); }
  [[gnu::always_inline]] static inline void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  [[gnu::always_inline]] static inline Reg broadcast(float f) { return _mm256_set1_ps(f); }
  [[gnu::always_inline]] static inline Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  [[gnu::always_inline]] static inline Mask mask(int64_t lanes) {
    const int n = static_cast<int>(lanes >= kWidth ? kWidth : lanes <= 0 ? 0 : lanes);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  [[gnu::always_inline]] static inline Reg load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  [[gnu::always_inline]] static inline void store(float* p, Mask m, Reg v) { _mm256_maskstore_ps(p, m, v); }
  [[gnu::always_inline]] static inline Reg keep(Reg v, Mask m) { return _mm256_and_ps(v, _mm256_castsi256_ps(m)); }
};
#include "small_gemm_tiles.inc"
}  // namespace avx2
#pragma GCC pop_options
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

// Which instruction set the kernels use, and who chose it. -1: nobody yet, the environment
// decides at the first call (a call to set_native_gemm_isa first overrides it unread).
enum class ChosenBy { Cpu, Environment, Call };
std::atomic<int> chosen_isa_{-1};
std::atomic<ChosenBy> chosen_by_{ChosenBy::Cpu};

const char* isa_requirement(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Avx512: return "AVX-512F";
    case GemmIsa::Avx2: return "AVX2 and FMA";
    default: return "nothing";
  }
}

// Refuses an instruction set the CPU lacks: its instructions would be a SIGILL.
GemmIsa require_cpu_has(GemmIsa isa, const std::string& who) {
  if (static_cast<int>(isa) <= static_cast<int>(cpu_gemm_isa())) return isa;
  throw ConfigError(who + ": the " + to_string(isa) + " kernels need " + isa_requirement(isa) +
                    ", which this CPU lacks; the best it has is " + to_string(cpu_gemm_isa()) +
                    " (choose that, \"auto\" or \"none\")");
}

GemmIsa isa_from_environment() {
  const char* value = std::getenv("PIPETRAIN_GEMM_ISA");
  if (!value || !*value) return cpu_gemm_isa();
  const std::string who = std::string("PIPETRAIN_GEMM_ISA=") + value;
  GemmIsa isa;
  try {
    isa = parse_gemm_isa(value);
  } catch (const ConfigError& e) {
    throw ConfigError(who + ": " + e.what());
  }
  return require_cpu_has(isa, who);
}

// The tiles of the instruction set in use; only after require_native.
const Tiles& tiles_in_use() {
#ifdef PIPETRAIN_HAVE_NATIVE_KERNELS
  if (native_gemm_isa() == GemmIsa::Avx512) return avx512::kTiles;
  return avx2::kTiles;
#else
  // Unreachable: cpu_gemm_isa() is None here, so require_native refused first.
  throw std::logic_error("pipetrain: no native GEMM kernels in a build for this architecture");
#endif
}

// The kernels' instructions exist only where the CPU has them: anywhere else they are a
// SIGILL, so each public entry checks before it touches one.
void require_native(const char* who) {
  if (native_gemm_available()) return;
  throw ConfigError(std::string(who) + ": pipetrain's native GEMM kernels (AVX-512F, or AVX2 and FMA) are off here: " +
                    native_gemm_summary() +
                    "; choose the kernel with parse_gemm_kernel(\"auto\") or use GemmKernel::Blas / OneDnn");
}

// The kernels read raw float32 memory of CPU tensors; anything else is refused by name.
void require_float_cpu(const char* who, const char* name, const torch::Tensor& t, int64_t dims) {
  detail::require_dense_cpu(who, name, t, dims, torch::kFloat, "float32");
}

using detail::sizes_of;

}  // namespace

GemmIsa cpu_gemm_isa() {
#ifdef PIPETRAIN_HAVE_NATIVE_KERNELS
  static const GemmIsa best = __builtin_cpu_supports("avx512f") ? GemmIsa::Avx512
                              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? GemmIsa::Avx2
                                                                                                 : GemmIsa::None;
  return best;
#else
  return GemmIsa::None;
#endif
}

GemmIsa native_gemm_isa() {
  int isa = chosen_isa_.load();
  if (isa >= 0) return static_cast<GemmIsa>(isa);
  const GemmIsa from_env = isa_from_environment();  // throws on a bad value, every call until fixed
  int unset = -1;
  if (chosen_isa_.compare_exchange_strong(unset, static_cast<int>(from_env))) {
    chosen_by_.store(std::getenv("PIPETRAIN_GEMM_ISA") ? ChosenBy::Environment : ChosenBy::Cpu);
  }
  return static_cast<GemmIsa>(chosen_isa_.load());
}

void set_native_gemm_isa(GemmIsa isa) {
  chosen_isa_.store(static_cast<int>(require_cpu_has(isa, "set_native_gemm_isa")));
  chosen_by_.store(ChosenBy::Call);
}

GemmIsa parse_gemm_isa(const std::string& name) {
  if (name == "auto") return cpu_gemm_isa();
  if (name == "avx512") return GemmIsa::Avx512;
  if (name == "avx2") return GemmIsa::Avx2;
  if (name == "none") return GemmIsa::None;
  throw ConfigError("unknown instruction set \"" + name + "\" for the native GEMM kernels; expected auto, avx512, "
                    "avx2 or none");
}

std::string to_string(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Avx512: return "avx512";
    case GemmIsa::Avx2: return "avx2";
    default: return "none";
  }
}

std::string native_gemm_summary() {
  const GemmIsa isa = native_gemm_isa();
  std::string out = to_string(isa);
  switch (chosen_by_.load()) {
    case ChosenBy::Environment: out += " (PIPETRAIN_GEMM_ISA; this CPU has " + to_string(cpu_gemm_isa()) + ")"; break;
    case ChosenBy::Call: out += " (set_native_gemm_isa; this CPU has " + to_string(cpu_gemm_isa()) + ")"; break;
    default:
      if (isa == GemmIsa::None) out += " (this CPU has neither AVX-512F nor AVX2 and FMA)";
      break;
  }
  if (native_disabled_.load()) out += ", switched off (disable_native_gemm)";
  return out;
}

bool native_gemm_available() { return native_gemm_isa() != GemmIsa::None && !native_disabled_.load(); }

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
  detail::check_linear_shapes("native_linear", x_in, weight_in, bias_in);
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
  const Tiles& kern = tiles_in_use();
  const int64_t tiles = (out + kern.rows - 1) / kern.rows;
  // y^T = W x^T: each tile is kern.rows output features x kern.cols rows, written back transposed.
  at::parallel_for(0, tiles, 8, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kMaxTileRows][kPanel];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = t * kern.rows;
      const int rows = static_cast<int>(std::min<int64_t>(kern.rows, out - r0));
      Next next;
      if (t + 1 < end && rows == kern.rows) next.a = w + (r0 + kern.rows) * k;
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t cols = std::min(kPanel, m - p * kPanel);
        for (int64_t c0 = 0; c0 < cols; c0 += kern.cols) {
          const bool last = p + 1 == panels && c0 + kern.cols >= cols;
          kern.tile(rows, k, w + r0 * k, k, xp + p * k * kPanel + c0, &acc[0][c0], last ? next : Next{});
        }
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
  const Tiles& kern = tiles_in_use();
  // The next panel (128 KiB from memory) a share per tile; AVX2's last tile (2 rows x 16
  // columns) is over long before a whole panel could arrive.
  const detail::PanelShares shares(k, (m + kern.rows - 1) / kern.rows * (kPanel / kern.cols));
  at::parallel_for(0, panels, 4, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kMaxTileRows][kPanel];
    for (int64_t p = begin; p < end; ++p) {
      const int64_t cols = std::min(kPanel, in - p * kPanel);
      int64_t fetched = 0;  // rows of the next panel asked for so far
      for (int64_t r0 = 0; r0 < m; r0 += kern.rows) {
        const int rows = static_cast<int>(std::min<int64_t>(kern.rows, m - r0));
        for (int64_t c0 = 0; c0 < cols; c0 += kern.cols) {
          Next next;
          if (p + 1 < end && fetched < shares.rows) {
            next.b = weight.panel(p + 1) + fetched * kPanel;
            next.b_shift = shares.shift;
            next.b_rows = shares.take(fetched);
          }
          kern.tile(rows, k, a + r0 * k, k, weight.panel(p) + c0, &acc[0][c0], next);
        }
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
  dy_packed_.pack(dy_);
  dy_packed_ptr_ = dy_packed_.panel(0);
  dy_ptr_ = dy_.data_ptr<float>();
}

void native_weight_grad(float* dw, float* db, int64_t r_begin, int64_t r_end,
                        const std::vector<const WeightGradOperands*>& parts, bool fresh, double* sqnorm) {
  if (parts.empty()) {
    // Nothing runs, so no tile could give the rows' squares.
    if (sqnorm) throw BatchError("native_weight_grad: a sum of squares (sqnorm) needs at least one part");
    return;
  }
  if (sqnorm) *sqnorm = 0.0;
  require_native("native_weight_grad");
  detail::check_weight_grad_call("native_weight_grad", "WeightGradOperands", dw, parts, r_begin, r_end);
  const int64_t out = parts.front()->out_features(), in = parts.front()->in_features();
  const int64_t panels = (in + kPanel - 1) / kPanel;
  const Tiles& kern = tiles_in_use();
  // A sum per panel, added in order afterwards: the same bits however the panels are split
  // across threads.
  std::vector<double> panel_sq(sqnorm ? static_cast<size_t>(panels) : 0, 0.0);
  // Panel-major: one panel of x stays in cache while the tiles of dy^T pass.
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t col0 = p * kPanel;
      const int64_t cols = std::min(kPanel, in - col0);
      for (int64_t c0 = 0; c0 < cols; c0 += kern.cols) {
        // A tile stays within one 32-row panel of packed dy.
        for (int64_t r0 = r_begin; r0 < r_end;) {
          const int64_t panel_end = std::min(r_end, (r0 / kPanel + 1) * kPanel);
          const int rows = static_cast<int>(std::min<int64_t>(kern.rows, panel_end - r0));
          // The next tile: the rows below, else the top of the next columns (this panel's or the next's).
          const bool more_columns = c0 + kern.cols < cols || p + 1 < end;
          const float* next = r0 + rows < r_end ? dw + (r0 + rows) * in + col0 + c0
                              : more_columns    ? dw + r_begin * in + col0 + c0 + kern.cols
                                                : nullptr;
          kern.weight_tile(rows, parts.data(), parts.size(), r0, p, c0, dw + r0 * in + col0 + c0, in, cols - c0,
                           fresh, next, sqnorm ? &panel_sq[static_cast<size_t>(p)] : nullptr);
          r0 += rows;
        }
      }
    }
  });
  if (sqnorm) {
    for (const double v : panel_sq) *sqnorm += v;
  }
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
