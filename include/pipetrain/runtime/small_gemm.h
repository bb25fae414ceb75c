// pipetrain's own kernels for the products of a Linear layer on a micro-batch of few rows.
//
// A pipeline splits a batch into micro-batches of a few dozen rows, and BLAS libraries are at
// their worst there: OpenBLAS re-packs the whole 1024x1024 weight for each 32-row product and
// reaches about half the speed it has on 256 rows (docs/engine.md#measured). These kernels
// never pack the weight per product:
//   forward      y = x W^T + b   computed as y^T = W x^T: the weight is read once, row by row,
//                                against the small x^T packed per call (cheap: M x in floats)
//   input grad   dx = dy W       against W packed once per weight version into 32-column
//                                panels (PackedWeight), reused by every micro-batch of a step
//   weight grad  dW += dy^T x    dy and x packed once per micro-batch, micro-batch
//                                after micro-batch into an accumulator that can stop and
//                                resume anywhere (below)
// They come in two instruction sets, chosen at run time: AVX-512F, else AVX2 with FMA (the
// same tiles at half the width, so every CPU since Haswell / Zen 1 has them; the results are
// the same bits, each element being the same chain of fused multiply-adds). Without either,
// native_gemm_available() is false and the engine takes oneDNN or BLAS instead.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::runtime {

// The kernels' instruction sets, in order: each CPU can run those up to its best.
enum class GemmIsa { None, Avx2, Avx512 };

// The best this CPU has: AVX-512F, else AVX2 with FMA, else None.
GemmIsa cpu_gemm_isa();
// The one the kernels use: cpu_gemm_isa(), unless the environment variable PIPETRAIN_GEMM_ISA
// (auto, avx512, avx2 or none; read at the first call, which a set_native_gemm_isa before it
// overrides) or set_native_gemm_isa chose another. ConfigError when the variable names an
// unknown set or one this CPU lacks, at every call until it is fixed.
GemmIsa native_gemm_isa();
// Forces `isa` for the whole process: tests of every path, and measuring the AVX2 path on an
// AVX-512 CPU. ConfigError when this CPU lacks it (its instructions would be a SIGILL).
void set_native_gemm_isa(GemmIsa isa);
// "auto" (this CPU's best), "avx512", "avx2" or "none"; anything else is a ConfigError.
GemmIsa parse_gemm_isa(const std::string& name);
std::string to_string(GemmIsa isa);  // "avx512", "avx2" or "none"
// One line for logs and errors: the set in use and who chose it, e.g. "avx2 (PIPETRAIN_GEMM_ISA;
// this CPU has avx512)".
std::string native_gemm_summary();

// True where the kernels have an instruction set (native_gemm_isa() is not None) and are not
// disabled.
bool native_gemm_available();
// Switches the kernels off (or on again where the CPU has them): "auto" then picks oneDNN or
// BLAS, as on a CPU without AVX2. For tests and to measure the portable path.
void disable_native_gemm(bool disabled);

// A weight W (out x in) laid out for dx = dy W: panels of 32 input features, each panel
// holding its 32 columns of every row contiguously; the last panel is zero-padded. Any
// matrix can be packed so: the fused weight gradient dW = dy^T x packs x.
class PackedWeight {
 public:
  PackedWeight() = default;
  explicit PackedWeight(const torch::Tensor& weight) { pack(weight); }

  // Packs `weight` (out x in), reusing this buffer when the shape is unchanged: a fresh
  // weight-sized buffer every step costs page faults worth a quarter of the packing.
  void pack(const torch::Tensor& weight);

  bool defined() const { return data_.defined(); }
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  const float* panel(int64_t p) const { return data_.data_ptr<float>() + p * out_ * kPanel; }

  static constexpr int64_t kPanel = 32;

 private:
  torch::Tensor data_;
  int64_t out_ = 0;
  int64_t in_ = 0;
};

// y = x W^T + b for x (M x in), W (out x in), b (out) or undefined; float32 CPU tensors.
// Every entry point below checks native_gemm_available() (ConfigError) and its operands'
// dtypes, devices and shapes (BatchError) before any kernel runs.
torch::Tensor native_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// dx = dy W for dy (M x out) and W packed.
torch::Tensor native_input_grad(const torch::Tensor& dy, const PackedWeight& weight);

// One micro-batch's share of a weight gradient, laid out for the kernel once: x and dy packed
// like a weight (PackedWeight), so that a tile reads both as short sequential streams; dy as it
// is too (the bias gradient). Keeps them alive.
class WeightGradOperands {
 public:
  WeightGradOperands(const torch::Tensor& dy, const torch::Tensor& x);

  int64_t rows() const { return rows_; }
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  // Raw pointers, read once: the kernel's tile loop must not call out of line (every call
  // would spill its 16 accumulator registers).
  const float* dy() const { return dy_ptr_; }
  const float* dy_panel(int64_t p) const { return dy_packed_ptr_ + p * rows_ * PackedWeight::kPanel; }
  const float* x_panel(int64_t p) const { return x_ptr_ + p * rows_ * PackedWeight::kPanel; }

 private:
  torch::Tensor dy_, x_;
  PackedWeight x_packed_, dy_packed_;
  int64_t rows_ = 0;
  int64_t out_ = 0;
  int64_t in_ = 0;
  const float* dy_ptr_ = nullptr;
  const float* x_ptr_ = nullptr;
  const float* dy_packed_ptr_ = nullptr;
};

// Rows [r_begin, r_end) of dW (out x in) and db (out; null: no bias) accumulate the parts in
// order: dW += dy^T x, db += the column sums of dy. `fresh` starts them from zero instead of
// their current values. Every element is one chain of float operations over the parts' rows in
// order, kept in float32 between calls, so any split of the parts or of the rows across calls
// gives the same bits as one call: the engine can run a weight gradient in pieces, whenever a
// stage would otherwise wait, without its result depending on the timing.
// `sqnorm` (optional): set to the sum of squares of dW's rows [r_begin, r_end) as this call
// leaves them (float32 within a tile, double across tiles; not db), computed while the tiles
// are in registers (at least one part: a BatchError otherwise). The gradient norm then costs
// no pass over memory.
void native_weight_grad(float* dw, float* db, int64_t r_begin, int64_t r_end,
                        const std::vector<const WeightGradOperands*>& parts, bool fresh,
                        double* sqnorm = nullptr);

}  // namespace pipetrain::runtime
