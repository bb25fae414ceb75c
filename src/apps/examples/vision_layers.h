// Layer specs of the image examples (cnn, resnet): convolutions, norms, pools, skips.
#pragma once

#include <fmt/format.h>
#include <torch/torch.h>

#include <string>

#include "apps/data/fashion_mnist.h"
#include "pipetrain/partition/layer_spec.h"
#include "pipetrain/skip/skippable.h"

namespace pipetrain::examples::detail {

inline LayerSpec conv_spec(int64_t in, int64_t out) {
  return LayerSpec::make(fmt::format("Conv2d({}, {}, 3, padding=1)", in, out), "Conv2d", [=] {
    return torch::nn::AnyModule(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
  });
}

inline LayerSpec batch_norm_spec(int64_t channels) {
  return LayerSpec::make(fmt::format("BatchNorm2d({})", channels), "BatchNorm2d",
                         [=] { return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels)); });
}

inline LayerSpec relu_spec() {
  return LayerSpec::make("ReLU", "ReLU", [] { return torch::nn::AnyModule(torch::nn::ReLU()); });
}

inline LayerSpec max_pool_spec() {
  return LayerSpec::make("MaxPool2d(2)", "MaxPool2d", [] {
    return torch::nn::AnyModule(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
  });
}

inline LayerSpec flatten_spec() {
  return LayerSpec::make("Flatten", "Flatten", [] { return torch::nn::AnyModule(torch::nn::Flatten()); });
}

inline LayerSpec linear_spec(int64_t in, int64_t out) {
  return LayerSpec::make(fmt::format("Linear({}, {})", in, out), "Linear",
                         [=] { return torch::nn::AnyModule(torch::nn::Linear(in, out)); });
}

// A skippable layer as a spec; its declaration is read from one built copy.
template <typename Make>
LayerSpec skip_spec(const std::string& name, Make make) {
  return LayerSpec::skippable(name, "Skip", [make] { return torch::nn::AnyModule(make()); },
                              make()->declaration());
}

}  // namespace pipetrain::examples::detail
