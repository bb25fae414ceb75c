// The order in which a data-parallel replica visits a data set: shuffled per epoch, sharded.
#pragma once

#include <cstdint>
#include <vector>

namespace pipetrain::data {

// Every epoch the whole index range [0, N) is shuffled with a permutation drawn from
// (seed, epoch), identical in every process; replica r of D takes every D-th index starting at
// r. The shards of one epoch are disjoint, of equal size floor(N / D), and together cover the
// permutation's first D x floor(N / D) entries; the N mod D left over differ from epoch to
// epoch. Without shuffling the permutation is the identity.
//
//   permutation(epoch):  p0 p1 p2 p3 p4 p5 p6 p7 p8 p9      N = 10, D = 3
//   replica 0:           p0       p3       p6              p9 is left over this epoch
//   replica 1:              p1       p4       p7
//   replica 2:                 p2       p5       p8
class ShardedSampler {
 public:
  // ConfigError unless N >= D >= 1 and 0 <= r < D.
  ShardedSampler(int64_t dataset_size, int64_t replicas, int64_t replica, uint64_t seed,
                 bool shuffle = true);

  int64_t dataset_size() const { return size_; }
  int64_t replicas() const { return replicas_; }
  int64_t replica() const { return replica_; }
  int64_t shard_size() const { return size_ / replicas_; }

  // This replica's indices for `epoch` (>= 0), in visiting order.
  std::vector<int64_t> indices(int64_t epoch) const;

  // The shared permutation of [0, n) for (seed, epoch): Fisher-Yates over a SplitMix64 stream.
  static std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch);

 private:
  int64_t size_, replicas_, replica_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace pipetrain::data
