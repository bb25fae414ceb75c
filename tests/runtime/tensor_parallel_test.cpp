// Tensor-parallel building blocks on threads of this process: the all-gather of slices of any
// layout (uneven parts, fused q/k/v chunks, bfloat16), and the sharded regions' random stream.
#include <gtest/gtest.h>

#include <exception>
#include <thread>

#include "pipetrain/comm/inprocess.h"
#include "pipetrain/runtime/checkpoint.h"
#include "pipetrain/runtime/dropout.h"
#include "pipetrain/runtime/tensor_parallel.h"

namespace pipetrain::runtime {
namespace {

// fn(group) on one thread per rank of a tensor-parallel group of `size`; rethrows a failure.
void run_group(int size, const std::function<void(const TensorParallelGroup&)>& fn) {
  auto hub = comm::InProcessHub::create(size);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto c = hub->endpoint(r);
        std::vector<int> all(static_cast<size_t>(size));
        for (int i = 0; i < size; ++i) all[static_cast<size_t>(i)] = i;
        TensorParallelGroup g;
        g.group = c->new_group({"tp", all});
        g.rank = r;
        g.size = size;
        fn(g);
        c->shutdown();
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(TensorParallelShards, GatherPutsEveryLayoutBackTogether) {
  struct Case {
    int64_t dim, full, stride;
    c10::ScalarType dtype;
  };
  // 10 rows in 2 chunks over 3 ranks: parts of 1, 2, 2 rows per chunk; 7 columns: 2, 2, 3.
  for (const Case k : {Case{0, 10, 2, torch::kFloat}, Case{1, 7, 1, torch::kFloat}, Case{1, 9, 3, torch::kBFloat16}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << k.dim << ", full " << k.full << ", stride " << k.stride);
    const auto full = torch::arange(k.full * 4, torch::kFloat)
                          .view(k.dim == 0 ? std::vector<int64_t>{k.full, 4} : std::vector<int64_t>{4, k.full})
                          .to(k.dtype);
    run_group(3, [&](const TensorParallelGroup& g) {
      ShardLayout layout;
      layout.dim = k.dim;
      layout.full_size = k.full;
      layout.stride = k.stride;
      layout.rank = g.rank;
      layout.size = g.size;
      const auto part = layout.slice(full);
      EXPECT_TRUE(gather_shards(part, layout, g).equal(full)) << "rank " << g.rank;
    });
  }
}

torch::Tensor mask_of(Dropout& drop) { return drop(torch::ones({64})).ne(0); }

TEST(ShardedRandom, InsideARankDrawsItsOwnStreamOutsideTheSharedOne) {
  // Two ranks of a group: the replicated stream is the same on both (here a task generator of
  // one seed), each has its own sharded stream.
  Dropout drop(0.5);
  std::vector<torch::Tensor> inside, outside;
  for (int rank : {0, 1}) {
    TensorParallelGroup g;
    g.sharded_rng = make_sharded_generator(7, rank);
    TensorParallelScope tp(g);
    TaskGeneratorScope replicated(make_generator(99));
    {
      ShardedRandomScope sharded;
      inside.push_back(mask_of(drop));
    }
    outside.push_back(mask_of(drop));
  }
  EXPECT_FALSE(inside[0].equal(inside[1]));
  EXPECT_TRUE(outside[0].equal(outside[1]));
  // The replicated stream did not move for the sharded draws: its first draw is outside's.
  {
    TaskGeneratorScope replicated(make_generator(99));
    EXPECT_TRUE(mask_of(drop).equal(outside[0]));
  }
  // Without a sharded stream (a group of 1) the scope changes nothing.
  {
    TaskGeneratorScope replicated(make_generator(99));
    ShardedRandomScope none;
    EXPECT_TRUE(mask_of(drop).equal(outside[0]));
  }
  // The rank's streams are fixed by the seed and the rank.
  TensorParallelGroup again;
  again.sharded_rng = make_sharded_generator(7, 0);
  TensorParallelScope tp(again);
  ShardedRandomScope sharded;
  EXPECT_TRUE(mask_of(drop).equal(inside[0]));
}

TEST(ShardedRandom, AnActivationCheckpointReplaysTheShardedStream) {
  Dropout drop(0.5);
  auto fn = [&](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
    torch::Tensor h = in[0] * 2;
    {
      ShardedRandomScope sharded;
      h = drop(h);
    }
    return {h * 3};
  };
  auto run = [&](bool checkpointed) {
    TensorParallelGroup g;
    g.sharded_rng = make_sharded_generator(11, 1);
    TensorParallelScope tp(g);
    auto x = torch::ones({256}).requires_grad_();
    auto y = checkpointed ? checkpointed_forward(fn, {x})[0] : fn({x})[0];
    y.sum().backward();
    // Where the group's stream is after the step: the recomputation drew from a copy.
    ShardedRandomScope sharded;
    return std::make_tuple(y.detach(), x.grad(), mask_of(drop));
  };
  const auto [y1, g1, next1] = run(false);
  const auto [y2, g2, next2] = run(true);
  EXPECT_TRUE(y1.equal(y2));
  EXPECT_TRUE(g1.equal(g2));
  EXPECT_TRUE(next1.equal(next2));
  EXPECT_TRUE(g1.eq(0).any().item<bool>() && g1.ne(0).any().item<bool>());  // the mask acted
}

}  // namespace
}  // namespace pipetrain::runtime
