// Whether autograd can carry a gradient through a tensor.
#pragma once

#include <torch/torch.h>

namespace pipetrain::runtime::detail {

// A defined floating or complex tensor: the kinds that can require grad.
inline bool differentiable(const torch::Tensor& t) { return t.defined() && (t.is_floating_point() || t.is_complex()); }

}  // namespace pipetrain::runtime::detail
