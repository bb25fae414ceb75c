// Tolerances for float32 results that sum the same terms as their reference in another order.
//
// A float32 sum of K terms rounds to within about K * eps * sum_k |term_k| of the exact sum
// (the first-order bound for recursive summation, element by element). The bound scales with
// the terms, not with the result: where terms cancel, the result is small and its error is
// not, so a fixed atol (1e-6) fails at random under another summation order or thread count.
// These helpers compare against a float64 reference with that bound.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <string>

namespace pipetrain::testing {

// got (float32) against exact (float64, same shape), element by element within
// terms * eps * abs_terms (abs_terms: the sum of each element's |terms|, float64).
inline ::testing::AssertionResult within_sum_bound(const torch::Tensor& got, const torch::Tensor& exact,
                                                   const torch::Tensor& abs_terms, int64_t terms) {
  if (!got.defined() || !exact.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (got.sizes() != exact.sizes()) {
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " vs " << exact.sizes();
  }
  if (got.numel() == 0) return ::testing::AssertionSuccess();
  const double eps = std::numeric_limits<float>::epsilon();
  // +1 term: rounding the float64 reference's inputs and the final store; 2x: a kernel may
  // round each partial product as well as each sum (no FMA).
  const auto bound = 2.0 * static_cast<double>(terms + 1) * eps * abs_terms.to(torch::kDouble) + 1e-30;
  const auto err = (got.to(torch::kDouble) - exact.to(torch::kDouble)).abs();
  const auto excess = (err / bound).max().item<double>();
  if (excess <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err.max().item<double>() << " is " << excess
                                       << "x the float32 summation bound";
}

// The bound for a product a (M x K) times b (K x N), exact in float64.
inline ::testing::AssertionResult matmul_close(const torch::Tensor& got, const torch::Tensor& a,
                                               const torch::Tensor& b) {
  const auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
  return within_sum_bound(got, torch::mm(ad, bd), torch::mm(ad.abs(), bd.abs()), a.size(1));
}

}  // namespace pipetrain::testing
