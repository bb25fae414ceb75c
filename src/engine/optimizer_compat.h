// The optimizer-state key that differs between LibTorch 1.13 and 2.x, named once for the engine.
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace pipetrain::detail {

// torch::optim keeps each parameter's state under its TensorImpl's address: printed as a
// string in 1.13 (c10::guts::to_string, gone in 2.x), the pointer itself in 2.x. The key type
// is read off this LibTorch's Optimizer::state().
using OptimizerStateKey =
    typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// A template so that the branch this LibTorch does not take is never compiled.
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // what c10::guts::to_string wrote
    out << p.unsafeGetTensorImpl();
    return out.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

}  // namespace pipetrain::detail
