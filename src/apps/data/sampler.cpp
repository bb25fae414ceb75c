// The order in which a data-parallel replica visits a data set: shuffled per epoch, sharded.
#include "apps/data/sampler.h"

#include <fmt/format.h>

#include <numeric>

#include "apps/data/rng.h"
#include "pipetrain/error.h"

namespace pipetrain::data {

ShardedSampler::ShardedSampler(int64_t dataset_size, int64_t replicas, int64_t replica,
                               uint64_t seed, bool shuffle)
    : size_(dataset_size), replicas_(replicas), replica_(replica), seed_(seed), shuffle_(shuffle) {
  if (replicas < 1) throw ConfigError(fmt::format("data replicas must be >= 1, got {}", replicas));
  if (replica < 0 || replica >= replicas)
    throw ConfigError(fmt::format("replica {} is outside the {} data replicas (0 to {})", replica,
                                  replicas, replicas - 1));
  if (dataset_size < replicas)
    throw ConfigError(fmt::format(
        "a data set of {} samples cannot be split across {} replicas; use at most {} replicas",
        dataset_size, replicas, dataset_size));
}

std::vector<int64_t> ShardedSampler::permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng = Rng::for_key({seed, static_cast<uint64_t>(epoch)});
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(p[i], p[j]);
  }
  return p;
}

std::vector<int64_t> ShardedSampler::indices(int64_t epoch) const {
  if (epoch < 0) throw ConfigError(fmt::format("epoch must be >= 0, got {}", epoch));
  std::vector<int64_t> order;
  if (shuffle_) {
    order = permutation(size_, seed_, epoch);
  } else {
    order.resize(static_cast<size_t>(size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(shard_size()));
  for (int64_t k = 0; k < shard_size(); ++k) shard.push_back(order[k * replicas_ + replica_]);
  return shard;
}

}  // namespace pipetrain::data
