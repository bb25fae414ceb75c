// A small seeded random stream for data order: the same numbers on every platform and library.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace pipetrain::data {

// SplitMix64 (Steele, Lea, Flood 2014). Data order must not depend on the standard library's
// distributions (implementation-defined) nor on torch's global generator (the model's).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // A stream for a tuple of coordinates, e.g. (seed, epoch) or (seed, step, replica, micro-batch).
  static Rng for_key(std::initializer_list<uint64_t> key) {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (const uint64_t k : key) h = mix(h ^ mix(k + 0x632BE59BD9B4E019ULL));
    return Rng(h);
  }

  uint64_t next() { return mix(state_ += 0x9E3779B97F4A7C15ULL); }

  // Uniform in [0, n), n > 0, without modulo bias (rejection on the short last interval).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace pipetrain::data
