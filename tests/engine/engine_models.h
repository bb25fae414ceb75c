// Small models and data for the engine tests, as layer specs.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "pipetrain/batch/data_iterator.h"
#include "pipetrain/engine/pipeline_module.h"

namespace pipetrain::testing {

// Tensors from their own generator: ranks are threads, and the default generator is shared.
inline torch::Tensor randn(std::vector<int64_t> sizes, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn(sizes, gen);
}

inline torch::Tensor mse(const Batch& out, const Batch& labels) {
  return torch::mse_loss(out.tensor(), labels.tensor());
}

// Linear(in, width), ReLU, [Linear(width, width), ReLU] x (depth - 2), Linear(width, out).
inline PipelineModule mlp(int64_t in, int64_t width, int64_t out, int depth) {
  PipelineModule m;
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", in, width));
  m.layers.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  for (int i = 0; i < depth - 2; ++i) {
    m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", width, width));
    m.layers.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  }
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", width, out));
  m.loss = mse;
  return m;
}

inline MicroBatch mlp_batch(int64_t step, int replica, int micro, int64_t rows, int64_t in, int64_t out) {
  const uint64_t seed = 1000 + static_cast<uint64_t>(step) * 7919 + static_cast<uint64_t>(replica) * 104729 +
                        static_cast<uint64_t>(micro) * 31;
  return {Batch(randn({rows, in}, seed)), Batch(randn({rows, out}, seed + 1))};
}

// A layer taking and returning (x, mask): rows whose mask is false are zeroed.
struct MaskedLinearImpl : torch::nn::Module {
  MaskedLinearImpl(int64_t in, int64_t out) : linear(register_module("linear", torch::nn::Linear(in, out))) {}
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> xs) {
    auto y = torch::relu(linear(xs.at(0))) * xs.at(1).unsqueeze(-1).to(torch::kFloat);
    return {y, xs.at(1)};
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(MaskedLinear);

inline PipelineModule masked_mlp(int64_t width, int depth) {
  PipelineModule m;
  for (int i = 0; i < depth; ++i) {
    m.layers.push_back(LayerSpec::make("MaskedLinear", "MaskedLinear",
                                       [width] { return torch::nn::AnyModule(MaskedLinear(width, width)); }));
  }
  m.loss = [](const Batch& out, const Batch& labels) {
    auto mask = out[1].to(torch::kFloat).unsqueeze(-1);
    return ((out[0] - labels.tensor()).pow(2) * mask).sum() / (mask.sum() * out[0].size(1) + 1e-9);
  };
  return m;
}

inline MicroBatch masked_batch(int64_t step, int replica, int micro, int64_t rows, int64_t width) {
  const uint64_t seed = 5000 + static_cast<uint64_t>(step) * 13 + static_cast<uint64_t>(micro) * 101 +
                        static_cast<uint64_t>(replica) * 997;
  auto x = randn({rows, width}, seed);
  auto mask = randn({rows}, seed + 2) > -0.5;  // a mix of kept and masked rows
  return {Batch::tuple({x, mask}), Batch(randn({rows, width}, seed + 1))};
}

// Input projection tied to the output projection (x W^T in, y W out), as a token embedding
// tied to the logits layer.
inline PipelineModule tied_mlp(int64_t in, int64_t width, int depth) {
  PipelineModule m;
  auto factory = [in, width] { return torch::nn::AnyModule(torch::nn::Linear(in, width)); };
  m.layers.push_back(LayerSpec::tied_layer("proj", "Project", "Embedding", factory));
  for (int i = 0; i < depth; ++i) {
    m.layers.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
    m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", width, width));
  }
  m.layers.push_back(LayerSpec::tied_layer("proj", "Unproject", "Embedding", factory,
                                           [](torch::nn::AnyModule& module, const Batch& x) {
                                             auto w = module.get<torch::nn::Linear>()->weight;
                                             return Batch(torch::matmul(x.tensor(), w));
                                           }));
  m.loss = mse;
  return m;
}

// tied_mlp with frozen parameters, as fine-tuning has them: the tied projection's bias, the
// first hidden Linear whole (a frozen embedding) and the second one's weight (LoRA's base).
inline PipelineModule frozen_tied_mlp(int64_t in, int64_t width) {
  PipelineModule m = tied_mlp(in, width, 3);
  auto freeze = [](torch::nn::AnyModule module, bool weight, bool bias) {
    auto linear = module.get<torch::nn::Linear>();
    if (weight) linear->weight.requires_grad_(false);
    if (bias) linear->bias.requires_grad_(false);
    return module;
  };
  const auto project = m.layers[0].build;
  m.layers[0].build = [=] { return freeze(project(), false, true); };
  m.layers[4].build = [=] { return freeze(torch::nn::AnyModule(torch::nn::Linear(width, width)), true, true); };
  m.layers[6].build = [=] { return freeze(torch::nn::AnyModule(torch::nn::Linear(width, width)), true, false); };
  m.layers[m.layers.size() - 1].build = m.layers[0].build;
  return m;
}

}  // namespace pipetrain::testing
