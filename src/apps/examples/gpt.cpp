// A small character-level GPT on the fortunes, its token embedding tied to the output layer.
#include <fmt/format.h>

#include "apps/data/char_corpus.h"
#include "apps/data/rng.h"
#include "apps/examples/builders.h"
#include "apps/examples/generate.h"
#include "apps/examples/gpt_modules.h"
#include "pipetrain/error.h"

namespace pipetrain::examples::detail {
namespace {

namespace nn = torch::nn;

constexpr const char* kEmbedKey = "embed";
constexpr int64_t kDefaultEvalWindows = 256;

// The layers, one spec each:
//
//   0        tied "embed"  Embedding(V, d)        ids [B, T] -> [B, T, d]
//   1        PositionEmbedding(T, d)             + pos[0..T)
//   2..L+1   GptBlock                            [B, T, d] -> [B, T, d]
//   L+2      LayerNorm(d)
//   L+3      tied "embed"  x @ embedding.weight^T -> logits [B, T, V]
//
// Both ends use one Embedding module; under a pipeline the first and last stage each hold a
// copy and the engine keeps them equal (same start, all-reduced gradients).
std::vector<LayerSpec> gpt_layers(const GptConfig& c) {
  std::vector<LayerSpec> layers;
  auto embedding = [c] { return make_token_embedding(c); };
  layers.push_back(LayerSpec::tied_layer(
      kEmbedKey, fmt::format("Embedding({}, {})", c.vocab, c.width), "Embedding", embedding));
  layers.push_back(LayerSpec::make(
      fmt::format("PositionEmbedding({}, {})", c.context, c.width), "PositionEmbedding",
      [c] { return nn::AnyModule(PositionEmbedding(c.context, c.width, c.init_std, c.dropout)); }));
  for (int64_t i = 0; i < c.blocks; ++i)
    layers.push_back(LayerSpec::make(fmt::format("GptBlock({}, heads={})", c.width, c.heads),
                                     "GptBlock", [c] { return nn::AnyModule(GptBlock(c)); }));
  layers.push_back(LayerSpec::make(fmt::format("LayerNorm({})", c.width), "LayerNorm", [c] {
    return nn::AnyModule(nn::LayerNorm(nn::LayerNormOptions({c.width})));
  }));
  layers.push_back(LayerSpec::tied_layer(
      kEmbedKey, fmt::format("Linear({}, {}) tied to Embedding", c.width, c.vocab), "Embedding",
      embedding, [](nn::AnyModule& module, const Batch& input) -> Batch {
        return embedding_logits(module, input.tensor());
      }));
  return layers;
}

}  // namespace

Example make_gpt(const ExampleOptions& options) {
  auto corpus = std::make_shared<const data::CharCorpus>(
      data::make_char_corpus(data::read_fortunes(options.data_dir())));
  GptConfig config;
  config.vocab = corpus->vocab.size();
  config.dropout = options.dropout();

  Example ex;
  ex.name = "gpt";
  ex.description = fmt::format(
      "character-level GPT on the fortunes ({} blocks, width {}, {} heads, context {}, "
      "vocabulary {}; embedding tied to the output)",
      config.blocks, config.width, config.heads, config.context, config.vocab);
  ex.layers = gpt_layers(config);
  ex.replicas = options.replicas();
  ex.seed = options.seed();
  ex.defaults.optimizer.type = "AdamW";
  ex.defaults.optimizer.lr = 2e-3;
  ex.defaults.optimizer.betas = {0.9, 0.99};
  ex.defaults.optimizer.weight_decay = 0.01;
  ex.defaults.scheduler.type = "WarmupLR";
  ex.defaults.scheduler.warmup_min_lr = ex.defaults.optimizer.lr / 10;
  ex.defaults.scheduler.warmup_max_lr = ex.defaults.optimizer.lr;
  ex.defaults.scheduler.warmup_num_steps = 50;
  ex.defaults.scheduler.warmup_type = "linear";
  ex.defaults.gradient_clipping = 1.0;
  ex.defaults.micro_batch_size = 16;
  ex.defaults.micro_batches = 4;
  ex.defaults.steps = 400;
  ex.defaults.eval_micro_batch_size = 64;
  apply_options(options, ex.defaults);

  const int64_t T = config.context, mbs = ex.defaults.micro_batch_size,
                micro_batches = ex.defaults.micro_batches, replicas = ex.replicas;
  const uint64_t seed = ex.seed;
  // Each micro-batch of a step draws its own windows, keyed by its index in the global batch
  // (replica r's micro-batch i is number r M + i): D replicas of M micro-batches see exactly
  // what one process of D M micro-batches sees.
  ex.train_micro_batch = [=](int64_t step, int64_t replica, int64_t i) {
    if (step < 0 || replica < 0 || replica >= replicas || i < 0 || i >= micro_batches)
      throw ConfigError(fmt::format(
          "no training micro-batch (step {}, replica {}, micro-batch {}) with {} replicas and {} "
          "micro-batches per step",
          step, replica, i, replicas, micro_batches));
    const uint64_t key =
        data::Rng::for_key({seed, static_cast<uint64_t>(step), uint64_t{0},
                            static_cast<uint64_t>(replica * micro_batches + i)})
            .next();
    auto w = data::random_windows(corpus->train, T, mbs, key);
    return MicroBatch{w.inputs, w.targets};
  };

  // Evaluation: the first windows of the validation text, split across replicas.
  const int64_t windows =
      std::min(data::count_windows(corpus->val, T),
               options.eval_samples() > 0 ? options.eval_samples() : kDefaultEvalWindows);
  const int64_t emb = ex.defaults.eval_micro_batch_size;
  auto shard_range = [=](int64_t replica) {
    return std::make_pair(windows * replica / replicas, windows * (replica + 1) / replicas);
  };
  ex.eval_micro_batches = [=](int64_t replica) {
    const auto [begin, end] = shard_range(replica);
    return (end - begin + emb - 1) / emb;
  };
  ex.eval_micro_batch = [=](int64_t replica, int64_t i) {
    const auto [begin, end] = shard_range(replica);
    const int64_t first = begin + i * emb;
    if (i < 0 || first >= end)
      throw ConfigError(fmt::format("no evaluation micro-batch {} for replica {}", i, replica));
    auto w = data::consecutive_windows(corpus->val, T, first, std::min(emb, end - first));
    return MicroBatch{w.inputs, w.targets};
  };

  ex.loss = [vocab = config.vocab](const Batch& output, const Batch& labels) {
    return gpt_cross_entropy(output.tensor(), labels.tensor(), vocab);
  };
  ex.metric.name = "val_loss";
  ex.metric.higher_is_better = false;
  ex.metric.measure = [loss = ex.loss](const Batch& output, const Batch& labels) {
    const double n = static_cast<double>(labels.tensor().numel());
    return MetricSum{loss(output, labels).item<double>() * n, n};
  };
  ex.sample = [corpus, T](BuiltLayers& model, const SampleOptions& sample) {
    return generate_text(model, corpus->vocab, T, sample);
  };
  return ex;
}

}  // namespace pipetrain::examples::detail
