// The checks the native kernels' entry points make before a kernel reads raw memory, and the
// input gradient's prefetch plan, shared by the float32 kernels (small_gemm.cpp) and the bf16
// ones (small_gemm_bf16.cpp).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/error.h"

namespace pipetrain::runtime::detail {

inline std::string sizes_of(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

// The kernels read raw memory of dense CPU tensors of one dtype (`dtype_name` for people:
// "float32", "bfloat16"); anything else is refused by name.
inline void require_dense_cpu(const char* who, const char* name, const torch::Tensor& t, int64_t dims,
                              c10::ScalarType dtype, const char* dtype_name) {
  if (t.defined() && t.dim() == dims && t.device().is_cpu() && t.scalar_type() == dtype &&
      t.layout() == torch::kStrided) {
    return;
  }
  throw BatchError(std::string(who) + ": " + name + " must be a dense " + dtype_name + " CPU tensor of " +
                   std::to_string(dims) + " dimension(s), got " +
                   (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + t.device().str() + " " +
                                      sizes_of(t)
                                : std::string("an undefined tensor")));
}

// The forward's operands fit y = x W^T + b (bias optional).
inline void check_linear_shapes(const std::string& who, const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& bias) {
  if (x.size(1) == weight.size(1) && (!bias.defined() || bias.size(0) == weight.size(0))) return;
  throw BatchError(who + ": x " + sizes_of(x) + ", weight " + sizes_of(weight) + " and bias " + sizes_of(bias) +
                   " do not fit y = x W^T + b (x: M x in, W: out x in, b: out)");
}

// A weight-gradient accumulator call: dw must be a buffer, every part present and of one
// shape, and rows [r_begin, r_end) inside the gradient's out features. `parts` is not empty.
template <typename Part>
void check_weight_grad_call(const std::string& who, const std::string& part_type, const float* dw,
                            const std::vector<const Part*>& parts, int64_t r_begin, int64_t r_end) {
  if (!dw) throw UsageError(who + ": dw is null; pass the out x in float32 gradient buffer");
  for (const auto* part : parts) {
    if (!part) throw UsageError(who + ": a null part; pass one " + part_type + " per micro-batch");
  }
  const int64_t out = parts.front()->out_features(), in = parts.front()->in_features();
  for (const auto* part : parts) {
    if (part->out_features() != out || part->in_features() != in) {
      throw BatchError(who + ": parts of shapes " + std::to_string(part->out_features()) + "x" +
                       std::to_string(part->in_features()) + " and " + std::to_string(out) + "x" + std::to_string(in) +
                       " accumulate into one gradient; give every part the layer's shape");
    }
  }
  if (!(0 <= r_begin && r_begin <= r_end && r_end <= out)) {
    throw BatchError(who + ": rows [" + std::to_string(r_begin) + ", " + std::to_string(r_end) +
                     ") lie outside the gradient's 0.." + std::to_string(out));
  }
}

// The input gradient fetches the next packed panel (`rows` rows) a share per tile of the current
// one: all of it during one tile asks more of memory than one core gets. A tile fetches one row
// every 2^shift of its `rows` steps, so a share is at most rows >> shift rows.
struct PanelShares {
  PanelShares(int64_t rows, int64_t tiles_per_panel)
      : rows(rows), share((rows + tiles_per_panel - 1) / tiles_per_panel) {
    while ((rows >> (shift + 1)) >= share) ++shift;
  }
  // How many rows the next tile fetches from row `fetched` (< rows) on; advances `fetched`.
  int64_t take(int64_t& fetched) const {
    const int64_t n = std::min(share, rows - fetched);
    fetched += n;
    return n;
  }

  int64_t rows;
  int64_t share;
  int shift = 0;
};

}  // namespace pipetrain::runtime::detail
