// One check per benchmark setup: a GEMM candidate's result against the float64 product.
//
// The bound is tests/support/tolerance.h's: each element of a K-term float32 sum is within
// 2 (K + 1) eps32 sum_k |a_ik b_kj| of the exact sum. A candidate that rounds its output
// (bfloat16 out of torch::mm on bfloat16) also gets half an ulp of that output (out_eps / 2
// times |exact|). a and b are the inputs the candidate really saw (already rounded to bfloat16
// for a bf16 kernel): the check asks "is the kernel right", not "what does bf16 lose".
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

namespace pipetrain::bench {

// Empty when got (M x N, any float dtype) = a (M x K) b (K x N) within the bound; else why not.
inline std::string gemm_mismatch(const torch::Tensor& got, const torch::Tensor& a, const torch::Tensor& b,
                                 double out_eps = 0.0) {
  const auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
  const auto exact = torch::mm(ad, bd);
  if (got.sizes() != exact.sizes()) {
    std::ostringstream os;
    os << "result has shape " << got.sizes() << ", expected " << exact.sizes();
    return os.str();
  }
  const double eps = std::numeric_limits<float>::epsilon();
  const auto bound = 2.0 * static_cast<double>(a.size(1) + 1) * eps * torch::mm(ad.abs(), bd.abs()) +
                     0.5 * out_eps * exact.abs() + 1e-30;
  const auto err = (got.to(torch::kDouble) - exact).abs();
  const double excess = (err / bound).max().item<double>();
  if (excess <= 1.0) return {};
  std::ostringstream os;
  os << "wrong result: max error " << err.max().item<double>() << " is " << excess
     << "x the float32 summation bound";
  return os.str();
}

}  // namespace pipetrain::bench
