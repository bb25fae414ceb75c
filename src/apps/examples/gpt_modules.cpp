// The modules of the character-level GPT example: position embedding, causal attention, block.
#include "apps/examples/gpt_modules.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "pipetrain/error.h"

namespace pipetrain::examples {
namespace {

namespace nn = torch::nn;

// Linear layers start as in GPT-2: weights normal(0, std), biases zero.
nn::Linear make_linear(int64_t in, int64_t out, double std) {
  nn::Linear linear(in, out);
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, std);
  linear->bias.zero_();
  return linear;
}

}  // namespace

PositionEmbeddingImpl::PositionEmbeddingImpl(int64_t context, int64_t width, double init_std) {
  weight = register_parameter("weight", torch::randn({context, width}) * init_std);
}

torch::Tensor PositionEmbeddingImpl::forward(const torch::Tensor& x) {
  const int64_t t = x.size(-2);
  if (t > weight.size(0))
    throw BatchError(
        fmt::format("a sequence of {} tokens is longer than the model's context of "
                    "{}; crop inputs to the last {} tokens",
                    t, weight.size(0), weight.size(0)));
  return x + weight.slice(0, 0, t);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c) : heads(c.heads) {
  if (c.width % c.heads != 0)
    throw ConfigError(fmt::format("width {} is not a multiple of the {} heads", c.width, c.heads));
  qkv = register_module("qkv", make_linear(c.width, 3 * c.width, c.init_std));
  // Residual projections scaled by 1/sqrt(2 x blocks), as GPT-2 does.
  proj = register_module("proj",
                         make_linear(c.width, c.width, c.init_std / std::sqrt(2.0 * c.blocks)));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2), hd = d / heads;
  // [B, T, 3d] -> 3 x [B, heads, T, hd]
  auto parts = qkv(x).view({B, T, 3, heads, hd}).permute({2, 0, 3, 1, 4}).unbind(0);
  const auto& q = parts[0];
  const auto& k = parts[1];
  const auto& v = parts[2];
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  const auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  auto y = torch::matmul(torch::softmax(scores, -1), v);  // [B, heads, T, hd]
  return proj(y.transpose(1, 2).reshape({B, T, d}));
}

GptBlockImpl::GptBlockImpl(const GptConfig& c) {
  ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({c.width})));
  attn = register_module("attn", CausalSelfAttention(c));
  ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({c.width})));
  fc = register_module("fc", make_linear(c.width, 4 * c.width, c.init_std));
  fc_out = register_module(
      "fc_out", make_linear(4 * c.width, c.width, c.init_std / std::sqrt(2.0 * c.blocks)));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn(ln1(x));
  return h + fc_out(torch::gelu(fc(ln2(h))));
}

nn::Embedding make_token_embedding(const GptConfig& c) {
  nn::Embedding embedding(c.vocab, c.width);
  torch::NoGradGuard no_grad;
  embedding->weight.normal_(0.0, c.init_std);
  return embedding;
}

}  // namespace pipetrain::examples
