// bfloat16 versions of the native Linear kernels (small_gemm.h), on AVX512_BF16's VDPBF16PS.
//
// VDPBF16PS multiplies pairs of bf16 numbers and adds both products to a float32 lane: twice
// the multiply-adds of a float32 FMA per instruction, so a bf16 product can run at twice the
// float32 kernels' speed, and oneDNN's bf16 products on a micro-batch of 32 rows do not (they
// run at the float32 kernels' speed or below: docs/performance.md, "Mixed precision"). The operands are laid
// out so that each 32-bit lane holds one pair along the reduction:
//   forward      y = x W^T + b   W row-major (a pair is two neighbours of a row), x^T packed
//   input grad   dx = dy W       dy row-major, W packed with its rows interleaved in pairs
//   weight grad  dW += dy^T x    dy and x packed with their rows interleaved in pairs, summed
//                                in float32 straight into the float32 gradient, resumable
//                                anywhere like native_weight_grad
// Sums are float32 throughout; y and dx are rounded to bf16 once, at the end (the bias is added
// in float32 before). The kernels need AVX-512F and AVX512_BF16 and run only while the native
// kernels run AVX-512 (not forced to AVX2, not disabled): native_bf16_available().
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace pipetrain::runtime {

// This CPU has AVX512_BF16 and the native kernels run AVX-512 (native_gemm_isa()).
bool native_bf16_available();

// A bf16 matrix S (rows x cols) laid out for VDPBF16PS: panels of 32 columns, each holding
// ceil(rows / 2) row pairs, each pair as 32 (column) x 2 (the pair) bf16, zero-padded past the
// last row and column. Built from any strides, so x^T needs no copy.
class PackedPairs {
 public:
  PackedPairs() = default;

  // Packs S[r][c] = src[r * row_stride + c * col_stride] (bf16 bits), reusing this buffer when
  // the shape is unchanged.
  void pack(const uint16_t* src, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);
  // A 2-D bf16 tensor as it is (W, dy or x), or transposed (x^T for the forward).
  void pack(const torch::Tensor& s, bool transposed = false);

  bool defined() const { return data_.defined(); }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t pairs() const { return (rows_ + 1) / 2; }
  // Pure arithmetic on a pointer kept at packing: the kernels' tile loops call this, and any
  // call out of line would spill their accumulator registers.
  const uint16_t* panel(int64_t p) const { return ptr_ + p * pairs() * 2 * kPanel; }

  static constexpr int64_t kPanel = 32;

 private:
  torch::Tensor data_;  // bf16, [panels][pairs][32][2]
  const uint16_t* ptr_ = nullptr;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
};

// y = x W^T + b for x (M x in) and W (out x in) bf16, b (out) float32 or undefined; y is bf16.
// ConfigError where !native_bf16_available(); BatchError for other dtypes or shapes.
torch::Tensor native_linear_bf16(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// dx = dy W for dy (M x out) bf16 and W packed (PackedPairs of W, rows = out); dx is bf16.
torch::Tensor native_input_grad_bf16(const torch::Tensor& dy, const PackedPairs& weight);

// One micro-batch's share of a weight gradient, packed once (dy and x as PackedPairs, rows =
// the micro-batch's rows); keeps dy for the bias gradient.
class WeightGradPairs {
 public:
  WeightGradPairs(const torch::Tensor& dy, const torch::Tensor& x);

  int64_t rows() const { return rows_; }
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  const uint16_t* dy() const { return dy_ptr_; }
  const uint16_t* dy_panel(int64_t p) const { return dy_packed_.panel(p); }
  const uint16_t* x_panel(int64_t p) const { return x_packed_.panel(p); }

 private:
  torch::Tensor dy_;
  PackedPairs dy_packed_, x_packed_;
  int64_t rows_ = 0;
  int64_t out_ = 0;
  int64_t in_ = 0;
  const uint16_t* dy_ptr_ = nullptr;
};

// native_weight_grad for bf16 parts: rows [r_begin, r_end) of the float32 dW (out x in) and db
// take in the parts in order, float32 sums, the same bits however parts and rows are split;
// `sqnorm` as there.
void native_weight_grad_bf16(float* dw, float* db, int64_t r_begin, int64_t r_end,
                             const std::vector<const WeightGradPairs*>& parts, bool fresh,
                             double* sqnorm = nullptr);

}  // namespace pipetrain::runtime
