// The example models: layer specs, loss, data, metric and defaults, by name ("cnn", "gpt", "mlp",
// "resnet").
//
// An Example is everything a trainer needs besides the model's placement: the single-process
// reference trainer builds all layers in one process, the PipelineEngine builds each stage's
// slice of the same specs. The data functions are random access, (step, replica, micro-batch)
// -> MicroBatch, so every process of a pipeline computes the same micro-batch without talking
// to the others, and a resumed run continues exactly where it stopped.
//
//   auto ex = examples::make_example("cnn", examples::ExampleOptions().replicas(2));
//   EngineConfig config = ex.engine_config();        // optimizer, batch sizes, seed
//   BuiltLayers model = examples::build_model(ex, config.seed);
//   MicroBatch mb = ex.train_micro_batch(step, replica, i);
//   torch::Tensor loss = ex.loss(model.forward(mb.inputs), mb.labels);  // mean over the rows
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/batch/data_iterator.h"
#include "pipetrain/engine/config.h"
#include "pipetrain/partition/layer_spec.h"

namespace pipetrain::examples {

// What to change from an example's defaults. 0 / "" keep the default.
struct ExampleOptions {
  TORCH_ARG(int64_t, replicas) = 1;          // data-parallel replicas: disjoint shards
  TORCH_ARG(int64_t, micro_batch_size) = 0;  // rows per micro-batch
  // Micro-batches per step and replica. 0: the example's, divided among the replicas where
  // they divide it (the global batch stays the example's, as DeepSpeed's train_batch_size).
  TORCH_ARG(int64_t, micro_batches) = 0;
  TORCH_ARG(int64_t, eval_micro_batch_size) = 0;
  TORCH_ARG(int64_t, eval_samples) = 0;   // evaluate on the first N samples only (tests)
  TORCH_ARG(uint64_t, seed) = 1234;       // data order (and the engine config's seed)
  TORCH_ARG(std::string, data_dir) = "";  // the data set's directory ("": the package's)
  TORCH_ARG(double, dropout) = 0.0;       // GPT-2's dropout probability (gpt only)
};

// An evaluation metric accumulated over micro-batches (and replicas): value = sum / count.
struct MetricSum {
  double sum = 0;
  double count = 0;
  MetricSum& operator+=(const MetricSum& other) {
    sum += other.sum;
    count += other.count;
    return *this;
  }
  double value() const { return count > 0 ? sum / count : 0.0; }
};

struct Metric {
  std::string name;  // "accuracy", "val_loss", "loss"
  bool higher_is_better = false;
  // The metric's sum and count on one evaluation micro-batch (output of the last layer).
  std::function<MetricSum(const Batch& output, const Batch& labels)> measure;
};

// An example's training recipe; make_example applies ExampleOptions to it.
struct TrainDefaults {
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  double gradient_clipping = 0.0;
  int64_t micro_batch_size = 32;
  int64_t micro_batches = 4;  // gradient accumulation steps per replica
  int64_t steps = 100;        // the default run length in optimizer steps
  int64_t eval_micro_batch_size = 256;
  int64_t pipeline_stages = 2;  // the default layout for `pipetrain train`
};

// A prompt-free text sample from a model holding all layers (gpt only).
struct SampleOptions {
  TORCH_ARG(int64_t, length) = 300;      // characters to generate
  TORCH_ARG(double, temperature) = 0.8;  // 0: greedy
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, prompt) = "";  // "": start from a blank line
};

struct Example {
  std::string name;
  std::string description;  // one line, for --help and logs
  std::vector<LayerSpec> layers;

  // The loss of one micro-batch, averaged over its rows (tokens for gpt): a scalar tensor.
  // A step's gradient is that of the mean over its micro-batches (and replicas), so trainers
  // scale each micro-batch's loss by 1 / (micro-batches x replicas) before backward.
  std::function<torch::Tensor(const Batch& output, const Batch& labels)> loss;
  Metric metric;
  TrainDefaults defaults;  // with ExampleOptions applied
  int64_t replicas = 1;
  uint64_t seed = 1234;

  // Training micro-batch `micro_batch` of `step` for `replica`, the same in every process.
  // inputs: cnn, resnet [B,1,28,28] float; gpt [B,T] int64; mlp [B,1024] float. labels: cnn [B]
  // int64; gpt [B,T] int64; mlp [B,1024] float.
  std::function<MicroBatch(int64_t step, int64_t replica, int64_t micro_batch)> train_micro_batch;
  // Steps in one pass over a replica's shard (cnn); 0 where the data has no epochs.
  int64_t steps_per_epoch = 0;

  // The evaluation set of `replica` (shards of the test/validation set when replicas > 1), as
  // eval_micro_batches(replica) micro-batches.
  std::function<int64_t(int64_t replica)> eval_micro_batches;
  std::function<MicroBatch(int64_t replica, int64_t index)> eval_micro_batch;

  // Empty, or generates text from a model built from all `layers` (gpt).
  std::function<std::string(BuiltLayers& model, const SampleOptions& options)> sample;

  // The micro-batches of steps [first_step, first_step + steps) for `replica`, in order;
  // steps < 0: without end.
  std::unique_ptr<DataIterator> train_iterator(int64_t replica, int64_t first_step = 0,
                                               int64_t steps = -1) const;
  std::unique_ptr<DataIterator> eval_iterator(int64_t replica = 0) const;
  // The defaults as the engine's configuration (batch sizes for `replicas`, optimizer,
  // scheduler, clipping, seed).
  EngineConfig engine_config() const;
};

// "cnn", "gpt", "mlp", "resnet"; ConfigError naming the choices for another name. Examples that need
// files check they exist here (DataError with the fix) but read them on first use.
Example make_example(const std::string& name, const ExampleOptions& options = {});
const std::vector<std::string>& example_names();  // {"cnn", "gpt", "mlp", "resnet"}
const char* default_example();                    // "cnn"

// The generator seed for layer `layer` of a model seeded with `seed`: the reference trainer
// and the engine seed each layer's construction with it, so initial weights do not depend on
// which stage builds a layer.
uint64_t layer_seed(uint64_t seed, int64_t layer);

// All layers in this process, each seeded with layer_seed(seed, i).
BuiltLayers build_model(const Example& example, uint64_t seed);

// train(true/false) on every module of a built model (batch norm, dropout).
void set_training(BuiltLayers& model, bool training);

}  // namespace pipetrain::examples
