// The benchmark workload "mlp" (bench/WORKLOADS.md) as an example: 16 x (Linear, ReLU), MSE.
#include <fmt/format.h>

#include "apps/data/mlp_workload.h"
#include "apps/examples/builders.h"
#include "pipetrain/error.h"

namespace pipetrain::examples::detail {
namespace {

namespace nn = torch::nn;

// Linear i (layer 2i) starts from WORKLOADS.md's weights whichever stage builds it and however
// the engine seeds the generator.
LayerSpec mlp_linear(int64_t i) {
  return LayerSpec::make(fmt::format("Linear({}, {})", data::kMlpWidth, data::kMlpWidth), "Linear",
                         [i] {
                           nn::Linear linear(data::kMlpWidth, data::kMlpWidth);
                           const auto& w = data::mlp_workload();
                           torch::NoGradGuard no_grad;
                           linear->weight.copy_(w.weights[i]);
                           linear->bias.copy_(w.biases[i]);
                           return nn::AnyModule(linear);
                         });
}

}  // namespace

Example make_mlp(const ExampleOptions& options) {
  Example ex;
  ex.name = "mlp";
  ex.description =
      "benchmark workload mlp: 16 x (Linear(1024, 1024), ReLU), fixed random data, MSE "
      "(bench/WORKLOADS.md)";
  for (int64_t i = 0; i < data::kMlpLinears; ++i) {
    ex.layers.push_back(mlp_linear(i));
    ex.layers.push_back(LayerSpec::make("ReLU", "ReLU", [] { return nn::AnyModule(nn::ReLU()); }));
  }
  ex.replicas = options.replicas();
  ex.seed = options.seed();
  ex.defaults.optimizer.type = "SGD";
  ex.defaults.optimizer.lr = 0.01;
  ex.defaults.micro_batch_size = data::kMlpRows / data::kMlpMicroBatches;
  ex.defaults.micro_batches = data::kMlpMicroBatches;
  ex.defaults.steps = 23;  // WORKLOADS.md: 3 warm-up + 20 timed steps
  ex.defaults.eval_micro_batch_size = data::kMlpRows;
  apply_options(options, ex.defaults);

  // Replica r's micro-batch i holds rows [(r M + i) B, (r M + i + 1) B) of the fixed batch,
  // wrapping around: with one replica and the defaults, the 8 micro-batches of 32 rows in
  // order, exactly as WORKLOADS.md splits it.
  const int64_t mbs = ex.defaults.micro_batch_size, micro_batches = ex.defaults.micro_batches,
                replicas = ex.replicas;
  ex.train_micro_batch = [=](int64_t step, int64_t replica, int64_t i) {
    if (step < 0 || replica < 0 || replica >= replicas || i < 0 || i >= micro_batches)
      throw ConfigError(fmt::format(
          "no training micro-batch (step {}, replica {}, micro-batch {}) with {} replicas and {} "
          "micro-batches per step",
          step, replica, i, replicas, micro_batches));
    const auto& w = data::mlp_workload();
    const int64_t first = ((replica * micro_batches + i) * mbs) % data::kMlpRows;
    if (first + mbs <= data::kMlpRows)
      return MicroBatch{w.x.slice(0, first, first + mbs), w.y.slice(0, first, first + mbs)};
    const auto rows = torch::arange(first, first + mbs, torch::kInt64).remainder(data::kMlpRows);
    return MicroBatch{w.x.index_select(0, rows), w.y.index_select(0, rows)};
  };

  // Evaluation: the loss on the whole fixed batch (replica 0 only, so sums are not doubled).
  const int64_t rows = options.eval_samples() > 0 ? std::min(options.eval_samples(), data::kMlpRows)
                                                  : data::kMlpRows;
  const int64_t emb = ex.defaults.eval_micro_batch_size;
  ex.eval_micro_batches = [=](int64_t replica) {
    return replica == 0 ? (rows + emb - 1) / emb : int64_t{0};
  };
  ex.eval_micro_batch = [=](int64_t replica, int64_t i) {
    const int64_t first = i * emb;
    if (replica != 0 || i < 0 || first >= rows)
      throw ConfigError(fmt::format("no evaluation micro-batch {} for replica {}", i, replica));
    const auto& w = data::mlp_workload();
    const int64_t last = std::min(rows, first + emb);
    return MicroBatch{w.x.slice(0, first, last), w.y.slice(0, first, last)};
  };

  ex.loss = [](const Batch& output, const Batch& labels) {
    return torch::mse_loss(output.tensor(), labels.tensor());
  };
  ex.metric.name = "loss";
  ex.metric.higher_is_better = false;
  ex.metric.measure = [](const Batch& output, const Batch& labels) {
    const double n = static_cast<double>(labels.tensor().numel());
    return MetricSum{torch::mse_loss(output.tensor(), labels.tensor()).item<double>() * n, n};
  };
  return ex;
}

}  // namespace pipetrain::examples::detail
