// Helpers for the GPipe tests: small models, deep copies, gradient comparison.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace pipetrain::testing {

// Linear/Tanh/ReLU layers: 6 layers, 8 features in, 4 out.
inline torch::nn::Sequential mlp6() {
  return torch::nn::Sequential(torch::nn::Linear(8, 12), torch::nn::Tanh(), torch::nn::Linear(12, 12),
                               torch::nn::ReLU(), torch::nn::Linear(12, 6), torch::nn::Linear(6, 4));
}

inline torch::nn::Sequential deep_copy(const torch::nn::Sequential& model) {
  return std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
}

inline std::vector<torch::Tensor> grads(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters()) {
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  }
  return out;
}

// float32 sums over micro-batches in another order, and the fast-path Linear's native kernels
// (another order within each product): relative 1e-5, absolute 1e-5.
inline void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::allclose(a[k], b[k], 1e-5, 1e-5))
        << what << ": tensor " << k << " differs by " << (a[k] - b[k]).abs().max().item<double>();
  }
}

}  // namespace pipetrain::testing
