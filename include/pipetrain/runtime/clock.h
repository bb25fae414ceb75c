// The fill-drain clock of GPipe: which (micro-batch, partition) tasks run at each tick.
//
// m = 4 micro-batches, n = 3 partitions; task (i, j) runs at tick k = i + j:
//
//   partition 0 │ 0 1 2 3 . .
//   partition 1 │ . 0 1 2 3 .
//   partition 2 │ . . 0 1 2 3
//               └─────────────► tick k = 0 .. m + n - 2
//
// Tasks of one tick run concurrently on different partitions' workers; tick k + 1 starts when
// every task of tick k has finished (forward only; backward follows autograd's graph).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace pipetrain::runtime {

// One tick's tasks as (i = micro-batch, j = partition) pairs, j ascending.
using Tick = std::vector<std::pair<int64_t, int64_t>>;

// The m + n - 1 ticks for m micro-batches over n partitions (empty when either is 0).
std::vector<Tick> clock_cycles(int64_t m, int64_t n);

}  // namespace pipetrain::runtime
