// The in-process channel and groups: ranks as threads, same contract as across processes.
#include <gtest/gtest.h>

#include <thread>

#include "pipetrain/comm/clock_sync.h"
#include "pipetrain/comm/inprocess.h"
#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank, communicator) in one thread per rank; rethrows the first failure.
void run_ranks(const std::shared_ptr<InProcessHub>& hub, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(hub->world_size()));
  for (int r = 0; r < hub->world_size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = hub->endpoint(r);
        fn(r, *comm);
        comm->shutdown();
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

TEST(InProcessChannel, TuplesWithMaskAndIdsAndVariableLengths) {
  auto hub = InProcessHub::create(2);
  run_ranks(hub, [](int rank, Communicator& c) {
    Channel& ch = c.channel();
    if (rank == 0) {
      for (int i = 0; i < 6; ++i) {
        const int64_t len = 3 + i % 3;  // sequence length changes every message
        auto x = torch::full({2, len, 4}, static_cast<float>(i)).requires_grad_();
        auto mask = torch::arange(len).lt(2).expand({2, len});
        auto ids = torch::arange(2 * len, torch::kLong).view({2, len}) + 100 * i;
        ch.isend(1, Stream::activation(), Batch::tuple({x, mask, ids}), "mb " + std::to_string(i));
      }
      ch.isend(1, Stream::activation(1), Batch(torch::ones({3})), "atomic");
    } else {
      std::vector<RecvHandle> handles;
      for (int i = 0; i < 6; ++i) handles.push_back(ch.irecv(0, Stream::activation(), "mb " + std::to_string(i)));
      const Batch atomic = ch.irecv(0, Stream::activation(1), "atomic").wait();
      EXPECT_TRUE(atomic.atomic());
      for (int i = 5; i >= 0; --i) {  // out of order
        const Batch b = handles[static_cast<size_t>(i)].wait();
        const int64_t len = 3 + i % 3;
        ASSERT_FALSE(b.atomic());
        ASSERT_EQ(b.size(), 3u);
        EXPECT_TRUE(b[0].equal(torch::full({2, len, 4}, static_cast<float>(i))));
        EXPECT_TRUE(b[0].requires_grad());
        EXPECT_TRUE(b[0].is_leaf());
        EXPECT_EQ(b[1].scalar_type(), torch::kBool);
        EXPECT_FALSE(b[1].requires_grad());
        EXPECT_TRUE(b[2].equal(torch::arange(2 * len, torch::kLong).view({2, len}) + 100 * i));
      }
    }
  });
}

TEST(InProcessChannel, CopiesByDefault) {
  auto hub = InProcessHub::create(2);
  run_ranks(hub, [](int rank, Communicator& c) {
    if (rank == 0) {
      auto x = torch::zeros({4});
      c.channel().isend(1, Stream::gradient(), Batch(x), "g").wait();
      x.fill_(7);  // after the send, the sender may reuse its tensor
      c.world().barrier();
    } else {
      auto h = c.channel().irecv(0, Stream::gradient(), "g");
      c.world().barrier();
      EXPECT_TRUE(h.wait().tensor().equal(torch::zeros({4})));
    }
  });
}

TEST(InProcessChannel, ReadyOnceTheMessageIsThere) {
  auto hub = InProcessHub::create(2);
  run_ranks(hub, [](int rank, Communicator& c) {
    if (rank == 0) {
      c.world().barrier();
      c.channel().isend(1, Stream::gradient(), Batch(torch::ones({2})), "g");
      c.world().barrier();
    } else {
      auto h = c.channel().irecv(0, Stream::gradient(), "g");
      EXPECT_FALSE(h.ready());
      c.world().barrier();
      c.world().barrier();
      EXPECT_TRUE(h.ready());
      EXPECT_TRUE(h.wait().tensor().equal(torch::ones({2})));
      EXPECT_TRUE(h.ready()) << "and stays so after the wait";
    }
  });
  EXPECT_FALSE(comm::RecvHandle().ready());
}

TEST(InProcessChannel, TimeoutNamesBothEnds) {
  auto hub = InProcessHub::create(2, CommOptions().timeout(200ms).heartbeat_interval(50ms));
  auto c1 = hub->endpoint(1);
  const auto start = std::chrono::steady_clock::now();
  try {
    c1->channel().irecv(0, Stream::activation(), "activation of micro-batch 5").wait();
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: recv activation of micro-batch 5 from rank 0 timed out after 200 ms"),
              std::string::npos)
        << e.what();
  }
  // The message names the 200 ms that ended the wait; a busy machine may wake it later, so only
  // the lower bound is a duration.
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
}

TEST(InProcessChannel, FailedRankWakesWaiters) {
  CommOptions options;
  options.rank_namer([](int r) { return "stage " + std::to_string(r) + " (rank " + std::to_string(r) + ")"; });
  auto hub = InProcessHub::create(3, options);
  std::string message;
  std::thread waiter([&] {
    auto c = hub->endpoint(2);
    try {
      c->channel().irecv(1, Stream::activation(), "activation of micro-batch 0").wait();
    } catch (const PeerError& e) {
      message = e.what();
    }
  });
  {
    auto c0 = hub->endpoint(0);
    try {
      throw std::runtime_error("boom");
    } catch (const std::exception& e) {
      c0->report_failure(std::string("out of memory in forward: ") + e.what());
    }
  }
  waiter.join();
  EXPECT_NE(message.find("stage 2 (rank 2): recv activation of micro-batch 0 from stage 1 (rank 1) failed: "
                         "stage 0 (rank 0) failed: out of memory in forward: boom"),
            std::string::npos)
      << message;
  EXPECT_THROW(hub->endpoint(1)->world().barrier(), PeerError);
}

TEST(InProcessChannel, RejectsBadPeersAndBatches) {
  auto hub = InProcessHub::create(2);
  auto c = hub->endpoint(0);
  EXPECT_THROW(c->channel().isend(0, Stream::activation(), Batch(torch::ones({1})), "x"), ConfigError);
  EXPECT_THROW(c->channel().irecv(2, Stream::activation(), "x"), ConfigError);
  EXPECT_THROW(c->channel().isend(1, Stream::activation(kMaxChunks), Batch(torch::ones({1})), "x"), ConfigError);
  EXPECT_THROW(c->channel().isend(1, Stream::activation(), Batch(torch::ones({1}, torch::kComplexFloat)), "x"),
               BatchError);
  EXPECT_THROW(hub->endpoint(0), UsageError);
}

// Ranks whose clocks start 1000 s apart (as hosts' monotonic clocks do) are put on rank 0's
// clock within the barrier's exit skew.
TEST(InProcessGroup, ClockOffsetsRecoverShiftedClocks) {
  auto hub = InProcessHub::create(3);
  std::vector<std::vector<double>> seen(3);
  run_ranks(hub, [&](int rank, Communicator& c) {
    const double shift = 1000.0 * rank - 250.0;
    seen[static_cast<size_t>(rank)] =
        estimate_clock_offsets(c.world(), rank, [shift] { return steady_seconds() + shift; });
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(seen[static_cast<size_t>(r)].size(), 3u);
    for (int i = 0; i < 3; ++i) {
      // Every rank computes the same table. The tolerance is the barrier's exit skew, which a
      // thread descheduled on a busy machine stretches (seconds, at worst): still 200 times
      // smaller than the 1000 s between the clocks it must recover.
      EXPECT_NEAR(seen[static_cast<size_t>(r)][static_cast<size_t>(i)], 1000.0 * i, 5.0) << r << " " << i;
    }
  }
}

TEST(InProcessGroup, Collectives) {
  auto hub = InProcessHub::create(4, CommOptions().bucket_bytes(64));
  run_ranks(hub, [](int rank, Communicator& c) {
    // Several buckets (64 bytes each), two dtypes, a non-contiguous tensor.
    std::vector<torch::Tensor> grads{torch::full({10}, 1.0f * rank), torch::full({3, 5}, 2.0 * rank),
                                     torch::full({6, 4}, static_cast<float>(rank)).t(),
                                     torch::full({2}, rank, torch::kLong)};
    c.world().all_reduce(grads, ReduceOp::Sum, "gradients");
    EXPECT_TRUE(grads[0].equal(torch::full({10}, 6.0f)));
    EXPECT_TRUE(grads[1].equal(torch::full({3, 5}, 12.0)));
    EXPECT_TRUE(grads[2].equal(torch::full({4, 6}, 6.0f)));
    EXPECT_TRUE(grads[3].equal(torch::full({2}, 6, torch::kLong)));
    std::vector<torch::Tensor> avg{torch::full({3}, 1.0f * rank)};
    c.world().all_reduce(avg, ReduceOp::Avg);
    EXPECT_TRUE(avg[0].allclose(torch::full({3}, 1.5f)));
    std::vector<torch::Tensor> mx{torch::full({2}, 1.0f * rank)};
    c.world().all_reduce(mx, ReduceOp::Max);
    EXPECT_TRUE(mx[0].equal(torch::full({2}, 3.0f)));
    auto w = torch::full({3}, 1.0f * rank).requires_grad_();  // a parameter
    std::vector<torch::Tensor> params{w};
    c.world().broadcast(params, 2);
    EXPECT_TRUE(w.equal(torch::full({3}, 2.0f)));
    EXPECT_DOUBLE_EQ(c.world().all_reduce_scalar(rank + 0.5, ReduceOp::Sum), 8.0);
    EXPECT_DOUBLE_EQ(c.world().all_reduce_scalar(rank, ReduceOp::Min), 0.0);
    const auto gathered = c.world().all_gather(torch::full({2, 3}, 1.0 * rank).t());
    ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{4, 3, 2}));
    for (int m = 0; m < 4; ++m) EXPECT_TRUE(gathered[m].equal(torch::full({3, 2}, 1.0 * m))) << m;
    c.world().barrier();
  });
}

TEST(InProcessGroup, PipeGroupsOfAGrid) {
  auto hub = InProcessHub::create(4);
  const Topology topo(2, 2);
  run_ranks(hub, [&](int rank, Communicator& c) {
    const PipeGroups g = build_pipe_groups(c, topo, {{"embed", {0, 1}}, {"head", {1}}});
    EXPECT_EQ(g.data_parallel->ranks(), topo.data_parallel_ranks(topo.stage_of(rank)));
    EXPECT_EQ(g.pipeline->ranks(), topo.pipeline_ranks(topo.replica_of(rank)));
    ASSERT_NE(g.tied_group("embed"), nullptr);
    EXPECT_EQ(g.tied_group("embed")->ranks(), topo.tied_ranks({0, 1}, topo.replica_of(rank)));
    EXPECT_EQ(g.tied_group("head") != nullptr, topo.stage_of(rank) == 1);
    std::vector<torch::Tensor> t{torch::full({1}, 1.0f + rank)};
    g.data_parallel->all_reduce(t);
    // stage 0 holds ranks 0 and 1, stage 1 ranks 2 and 3
    EXPECT_EQ(t[0].item<float>(), rank < 2 ? 3.0f : 7.0f);
    EXPECT_DOUBLE_EQ(g.tied_group("embed")->all_reduce_scalar(1.0), 2.0);
  });
  auto extra = InProcessHub::create(3);
  EXPECT_THROW(build_pipe_groups(*extra->endpoint(0), topo), ConfigError);
}

TEST(InProcessGroup, MismatchedCallsFailEveryone) {
  auto hub = InProcessHub::create(2, CommOptions().timeout(10s));
  EXPECT_THROW(run_ranks(hub,
                         [](int rank, Communicator& c) {
                           if (rank == 0) {
                             c.world().barrier();
                           } else {
                             std::vector<torch::Tensor> t{torch::ones({2})};
                             c.world().all_reduce(t);
                           }
                         }),
               CommError);
}

TEST(InProcessGroup, TimeoutNamesMissingRanks) {
  auto hub = InProcessHub::create(3, CommOptions().timeout(150ms).heartbeat_interval(50ms));
  auto c0 = hub->endpoint(0);
  try {
    c0->world().barrier("end of step 3");
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: end of step 3 (barrier) over group world [ranks 0, 1, 2], "
                                         "waiting for ranks 1, 2 timed out after 150 ms"),
              std::string::npos)
        << e.what();
  }
}

TEST(Buckets, Plan) {
  std::vector<torch::Tensor> t{torch::zeros({10}), torch::zeros({0}), torch::zeros({20}, torch::kDouble),
                               torch::zeros({30}), torch::zeros({100}), torch::zeros({5})};
  const auto buckets = plan_buckets(t, 160);  // 40 floats or 20 doubles
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].indices, (std::vector<size_t>{0, 3}));
  EXPECT_EQ(buckets[1].indices, (std::vector<size_t>{2}));
  EXPECT_EQ(buckets[2].indices, (std::vector<size_t>{4}));  // larger than a bucket: alone
  EXPECT_EQ(buckets[3].indices, (std::vector<size_t>{5}));
  EXPECT_EQ(buckets[0].numel, 40);
}

}  // namespace
}  // namespace pipetrain::comm
