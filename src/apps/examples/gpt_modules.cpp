// The modules of the character-level GPT example: position embedding, causal attention, block.
#include "apps/examples/gpt_modules.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "pipetrain/error.h"
#include "pipetrain/runtime/parallel_layers.h"

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

// The full layer as one process builds it (same draws), then this rank's slice of it.
nn::AnyModule column_parallel(nn::Linear full, int64_t stride = 1) {
  const auto& tp = runtime::current_tensor_parallel();
  if (!tp.active()) return nn::AnyModule(full);
  return nn::AnyModule(runtime::ColumnParallelLinear(full, tp, stride));
}

nn::AnyModule row_parallel(nn::Linear full) {
  const auto& tp = runtime::current_tensor_parallel();
  if (!tp.active()) return nn::AnyModule(full);
  return nn::AnyModule(runtime::RowParallelLinear(full, tp));
}

}  // namespace

PositionEmbeddingImpl::PositionEmbeddingImpl(int64_t context, int64_t width, double init_std, double dropout) {
  weight = register_parameter("weight", torch::randn({context, width}) * init_std);
  drop = register_module("drop", runtime::Dropout(dropout));
}

torch::Tensor PositionEmbeddingImpl::forward(const torch::Tensor& x) {
  const int64_t t = x.size(-2);
  if (t > weight.size(0))
    throw BatchError(
        fmt::format("a sequence of {} tokens is longer than the model's context of "
                    "{}; crop inputs to the last {} tokens",
                    t, weight.size(0), weight.size(0)));
  return drop(x + weight.slice(0, 0, t));
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c) : heads(c.heads) {
  if (c.width % c.heads != 0)
    throw ConfigError(fmt::format("width {} is not a multiple of the {} heads", c.width, c.heads));
  const int tp = runtime::current_tensor_parallel().size;
  if (c.heads % tp != 0)
    throw ConfigError(fmt::format("the {} attention heads do not split over a tensor-parallel size of {}; use a "
                                  "size that divides {}",
                                  c.heads, tp, c.heads));
  heads = c.heads / tp;
  qkv = column_parallel(make_linear(c.width, 3 * c.width, c.init_std), /*stride=*/3);
  register_module("qkv", qkv.ptr());
  // Residual projections scaled by 1/sqrt(2 x blocks), as GPT-2 does.
  proj = row_parallel(make_linear(c.width, c.width, c.init_std / std::sqrt(2.0 * c.blocks)));
  register_module("proj", proj.ptr());
  attn_drop = register_module("attn_drop", runtime::Dropout(c.dropout));
  resid_drop = register_module("resid_drop", runtime::Dropout(c.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  // [B, T, 3 d'] -> 3 x [B, heads', T, hd] (d' = this rank's heads x hd)
  const auto mixed = qkv.forward(x);
  const int64_t local = mixed.size(-1) / 3, hd = local / heads;
  auto parts = mixed.view({B, T, 3, heads, hd}).permute({2, 0, 3, 1, 4}).unbind(0);
  const auto& q = parts[0];
  const auto& k = parts[1];
  const auto& v = parts[2];
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  const auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores, -1);
  {
    // Only this rank's heads: their masks come from its own stream (Megatron's model-parallel
    // RNG), where a single process would draw the heads' masks one after another.
    runtime::ShardedRandomScope sharded;
    probs = attn_drop(probs);
  }
  auto y = torch::matmul(probs, v);  // [B, heads', T, hd]
  // After the row-parallel reduction the activation is replicated: the same mask on every rank.
  return resid_drop(proj.forward(y.transpose(1, 2).reshape({B, T, local})));
}

GptBlockImpl::GptBlockImpl(const GptConfig& c) {
  ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({c.width})));
  attn = register_module("attn", CausalSelfAttention(c));
  ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({c.width})));
  fc = column_parallel(make_linear(c.width, 4 * c.width, c.init_std));
  register_module("fc", fc.ptr());
  fc_out = row_parallel(make_linear(4 * c.width, c.width, c.init_std / std::sqrt(2.0 * c.blocks)));
  register_module("fc_out", fc_out.ptr());
  resid_drop = register_module("resid_drop", runtime::Dropout(c.dropout));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn(ln1(x));
  return h + resid_drop(fc_out.forward(torch::gelu(fc.forward(ln2(h)))));
}

nn::AnyModule make_token_embedding(const GptConfig& c) {
  nn::Embedding embedding(c.vocab, c.width);
  {
    torch::NoGradGuard no_grad;
    embedding->weight.normal_(0.0, c.init_std);
  }
  const auto& tp = runtime::current_tensor_parallel();
  if (!tp.active()) return nn::AnyModule(embedding);
  return nn::AnyModule(runtime::VocabParallelEmbedding(embedding, tp));
}

torch::Tensor embedding_logits(nn::AnyModule& embedding, const torch::Tensor& h) {
  if (auto* parallel = dynamic_cast<runtime::VocabParallelEmbeddingImpl*>(embedding.ptr().get())) {
    // h is the same on every rank and each rank's logits depend on all of it: f before.
    return torch::matmul(runtime::copy_to_tensor_parallel(h, parallel->group), parallel->weight.t());
  }
  return torch::matmul(h, embedding.get<nn::Embedding>()->weight.t());
}

torch::Tensor gpt_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab) {
  const auto& tp = runtime::current_tensor_parallel();
  const auto flat = logits.reshape({-1, logits.size(-1)});
  if (!tp.active()) return torch::nn::functional::cross_entropy(flat, targets.reshape({-1}));
  return runtime::vocab_parallel_cross_entropy(flat, targets.reshape({-1}), vocab * tp.rank / tp.size, tp).mean();
}

}  // namespace pipetrain::examples
