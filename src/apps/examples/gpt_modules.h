// The modules of the character-level GPT example: position embedding, causal attention, block.
#pragma once

#include <torch/torch.h>

namespace pipetrain::examples {

struct GptConfig {
  int64_t vocab = 0;     // from the corpus
  int64_t context = 64;  // T: longest sequence (the position embedding's rows)
  int64_t width = 128;   // d_model
  int64_t heads = 4;
  int64_t blocks = 4;
  double init_std = 0.02;  // GPT-2's initialisation
};

// Adds a learned embedding of positions 0..T-1 to [B, T, d] token embeddings.
class PositionEmbeddingImpl : public torch::nn::Module {
 public:
  PositionEmbeddingImpl(int64_t context, int64_t width, double init_std);
  torch::Tensor forward(const torch::Tensor& x);  // BatchError when T > context
  torch::Tensor weight;                           // [context, width]
};
TORCH_MODULE(PositionEmbedding);

// Multi-head self-attention where position t attends to positions <= t.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  int64_t heads;
};
TORCH_MODULE(CausalSelfAttention);

// A pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)) with a 4d GELU MLP.
class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, fc_out{nullptr};
};
TORCH_MODULE(GptBlock);

// The token embedding, normal(0, init_std): the tied module of the first and last layer.
torch::nn::Embedding make_token_embedding(const GptConfig& config);

}  // namespace pipetrain::examples
