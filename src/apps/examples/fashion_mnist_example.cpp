// The Fashion-MNIST examples' shared part: data, sharding, evaluation, loss and metric.
#include <fmt/format.h>

#include <map>
#include <mutex>

#include "apps/data/fashion_mnist.h"
#include "apps/data/sampler.h"
#include "apps/examples/builders.h"
#include "pipetrain/error.h"

namespace pipetrain::examples::detail {
namespace {

// The data sets, read on first use (a middle pipeline stage never reads them), and each
// replica's order of the current epoch.
class FashionMnistData {
 public:
  FashionMnistData(std::string dir, int64_t replicas, uint64_t seed)
      : dir_(std::move(dir)), replicas_(replicas), seed_(seed) {}

  const data::ImageSet& train() {
    std::call_once(train_once_,
                   [&] { train_ = data::load_fashion_mnist(data::Split::kTrain, dir_); });
    return train_;
  }
  const data::ImageSet& test() {
    std::call_once(test_once_, [&] { test_ = data::load_fashion_mnist(data::Split::kTest, dir_); });
    return test_;
  }

  // Rows [begin, begin + count) of replica r's shard in `epoch`.
  torch::Tensor indices(int64_t replica, int64_t epoch, int64_t begin, int64_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& cached = orders_[replica];
    if (cached.first != epoch || cached.second.empty()) {
      data::ShardedSampler sampler(train().size(), replicas_, replica, seed_);
      cached = {epoch, sampler.indices(epoch)};
    }
    return torch::tensor(
        std::vector<int64_t>(cached.second.begin() + begin, cached.second.begin() + begin + count),
        torch::kInt64);
  }

 private:
  std::string dir_;
  int64_t replicas_;
  uint64_t seed_;
  std::once_flag train_once_, test_once_;
  data::ImageSet train_, test_;
  std::mutex mutex_;
  std::map<int64_t, std::pair<int64_t, std::vector<int64_t>>> orders_;
};

constexpr int64_t kTrainSize = 60000;
constexpr int64_t kTestSize = 10000;

}  // namespace

Example make_fashion_mnist_example(std::string name, std::string description, std::vector<LayerSpec> layers,
                                   const ExampleOptions& options) {
  Example ex;
  ex.name = std::move(name);
  ex.description = std::move(description);
  ex.layers = std::move(layers);
  ex.replicas = options.replicas();
  ex.seed = options.seed();
  ex.defaults.optimizer.type = "Adam";
  ex.defaults.optimizer.lr = 1e-3;
  ex.defaults.micro_batch_size = 32;
  ex.defaults.micro_batches = 4;
  ex.defaults.eval_micro_batch_size = 500;
  apply_options(options, ex.defaults);
  data::check_fashion_mnist(options.data_dir());

  const int64_t per_step = ex.defaults.micro_batch_size * ex.defaults.micro_batches;
  const int64_t shard = kTrainSize / ex.replicas;
  if (per_step > shard)
    throw ConfigError(fmt::format(
        "a step of {} x {} samples does not fit a replica's shard of {} training samples",
        ex.defaults.micro_batches, ex.defaults.micro_batch_size, shard));
  ex.steps_per_epoch = shard / per_step;
  ex.defaults.steps = 2 * ex.steps_per_epoch;

  auto store =
      std::make_shared<FashionMnistData>(data::fashion_mnist_dir(options.data_dir()), ex.replicas, ex.seed);
  const int64_t spe = ex.steps_per_epoch, mbs = ex.defaults.micro_batch_size,
                micro_batches = ex.defaults.micro_batches, replicas = ex.replicas;
  ex.train_micro_batch = [=](int64_t step, int64_t replica, int64_t i) {
    if (step < 0 || replica < 0 || replica >= replicas || i < 0 || i >= micro_batches)
      throw ConfigError(fmt::format(
          "no training micro-batch (step {}, replica {}, micro-batch {}) with {} replicas and {} "
          "micro-batches per step",
          step, replica, i, replicas, micro_batches));
    const auto rows =
        store->indices(replica, step / spe, (step % spe) * mbs * micro_batches + i * mbs, mbs);
    const auto& train = store->train();
    return MicroBatch{train.images.index_select(0, rows), train.labels.index_select(0, rows)};
  };

  // Replica r evaluates rows [r N / D, (r + 1) N / D) of the (possibly truncated) test set.
  const int64_t test_rows =
      options.eval_samples() > 0 ? std::min(options.eval_samples(), kTestSize) : kTestSize;
  const int64_t emb = ex.defaults.eval_micro_batch_size;
  auto shard_range = [=](int64_t replica) {
    return std::make_pair(test_rows * replica / replicas, test_rows * (replica + 1) / replicas);
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
    const auto& test = store->test();
    const int64_t last = std::min(end, first + emb);
    return MicroBatch{test.images.slice(0, first, last), test.labels.slice(0, first, last)};
  };

  ex.loss = [](const Batch& output, const Batch& labels) {
    return torch::nn::functional::cross_entropy(output.tensor(), labels.tensor());
  };
  ex.metric.name = "accuracy";
  ex.metric.higher_is_better = true;
  ex.metric.measure = [](const Batch& output, const Batch& labels) {
    const auto correct = output.tensor().argmax(1).eq(labels.tensor()).sum().item<int64_t>();
    return MetricSum{static_cast<double>(correct), static_cast<double>(labels.tensor().size(0))};
  };
  return ex;
}

}  // namespace pipetrain::examples::detail
