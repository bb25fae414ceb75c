// The modules of the character-level GPT example: position embedding, causal attention, block.
#pragma once

#include <torch/torch.h>

#include "pipetrain/runtime/dropout.h"

namespace pipetrain::examples {

struct GptConfig {
  int64_t vocab = 0;     // from the corpus
  int64_t context = 64;  // T: longest sequence (the position embedding's rows)
  int64_t width = 128;   // d_model
  int64_t heads = 4;
  int64_t blocks = 4;
  double init_std = 0.02;  // GPT-2's initialisation
  // GPT-2's dropout (attention probabilities, residual branches, embeddings); 0: none. Under
  // tensor parallelism the attention dropout is sharded (each rank's heads draw their own).
  double dropout = 0.0;
};

// Adds a learned embedding of positions 0..T-1 to [B, T, d] token embeddings.
class PositionEmbeddingImpl : public torch::nn::Module {
 public:
  PositionEmbeddingImpl(int64_t context, int64_t width, double init_std, double dropout = 0.0);
  torch::Tensor forward(const torch::Tensor& x);  // BatchError when T > context
  torch::Tensor weight;                           // [context, width]
  runtime::Dropout drop{nullptr};                 // of the sum
};
TORCH_MODULE(PositionEmbedding);

// Multi-head self-attention where position t attends to positions <= t. Built under a
// tensor-parallel group of T ranks (runtime/tensor_parallel.h), Megatron's split: each rank
// keeps heads/T heads (qkv column-parallel, its q, k and v rows of them) and its slice of the
// output projection (row-parallel), from the weights the whole module would have.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]
  // nn::Linear, or its column-/row-parallel slice under a tensor-parallel group.
  torch::nn::AnyModule qkv, proj;
  runtime::Dropout attn_drop{nullptr}, resid_drop{nullptr};
  int64_t heads;  // on this rank
};
TORCH_MODULE(CausalSelfAttention);

// A pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)) with a 4d GELU MLP
// (fc column-parallel and fc_out row-parallel under a tensor-parallel group).
class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::AnyModule fc, fc_out;
  runtime::Dropout resid_drop{nullptr};
};
TORCH_MODULE(GptBlock);

// The token embedding, normal(0, init_std): the tied module of the first and last layer. Under
// a tensor-parallel group, this rank's rows of it (runtime::VocabParallelEmbedding).
torch::nn::AnyModule make_token_embedding(const GptConfig& config);

// The logits of `h` [B, T, d] against the token embedding (the tied output layer): all of the
// vocabulary, or this rank's columns under a tensor-parallel group.
torch::Tensor embedding_logits(torch::nn::AnyModule& embedding, const torch::Tensor& h);

// The mean cross-entropy of `logits` [B, T, V or V/T] against `targets` [B, T]: over the
// vocabulary split across the current tensor-parallel group when there is one.
torch::Tensor gpt_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab);

}  // namespace pipetrain::examples
