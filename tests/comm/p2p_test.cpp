// The Gloo channel between processes: tuples with masks and ids, layout changes, many
// messages in flight both ways, chunk streams that never mix, timeouts that name both ends.
#include <gtest/gtest.h>

#include "pipetrain/error.h"
#include "support/ranks.h"
#include "worker_util.h"

namespace pipetrain::comm {
namespace {

using namespace std::chrono_literals;
using testing::SpawnOptions;

// Message i of the activation stream: its layout changes now and then (sequence length,
// tensor count, atomic vs tuple), as variable-length batches do.
Batch activation(int i) {
  const int64_t len = std::vector<int64_t>{5, 5, 7, 7, 7, 3, 0, 4, 4, 4, 4, 6}[static_cast<size_t>(i % 12)];
  auto x = torch::arange(2 * len * 3, torch::kFloat).view({2, len, 3}).add(1000.0 * i).requires_grad_();
  if (i % 12 == 8) return Batch(x);  // atomic
  auto mask = (torch::arange(len) % 2 == 0).expand({2, len}).contiguous();
  auto ids = torch::arange(2 * len, torch::kLong).view({2, len}) * (i + 1);
  if (i % 12 == 9) return Batch::tuple({x, ids});  // fewer tensors
  return Batch::tuple({x, mask, ids});
}

void expect_same(const Batch& got, const Batch& want, int i) {
  ASSERT_EQ(got.atomic(), want.atomic()) << "message " << i;
  ASSERT_EQ(got.size(), want.size()) << "message " << i;
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(got[k].scalar_type(), want[k].scalar_type()) << "message " << i << " tensor " << k;
    EXPECT_EQ(got[k].sizes(), want[k].sizes()) << "message " << i << " tensor " << k;
    EXPECT_TRUE(got[k].equal(want[k].detach())) << "message " << i << " tensor " << k;
    EXPECT_EQ(got[k].requires_grad(), want[k].requires_grad()) << "message " << i << " tensor " << k;
  }
}

PIPETRAIN_RANK_WORKER(p2p_exchange) {
  auto comm = test::connect_for_test();
  Channel& ch = comm->channel();
  const int peer = 1 - comm->rank();
  constexpr int kMessages = 36;
  if (comm->rank() == 0) {
    // Pipeline-like: send activations, receive gradients, everything asynchronous.
    std::vector<RecvHandle> grads;
    for (int i = 0; i < kMessages; ++i) grads.push_back(ch.irecv(peer, Stream::gradient(), "gradient " + std::to_string(i)));
    std::vector<SendHandle> sends;
    for (int i = 0; i < kMessages; ++i) {
      sends.push_back(ch.isend(peer, Stream::activation(), activation(i), "activation " + std::to_string(i)));
      // A second chunk's stream interleaved with the first: messages never mix.
      if (i % 3 == 0) ch.isend(peer, Stream::activation(1), Batch(torch::full({4}, -i, torch::kInt)), "chunk 1");
    }
    for (int i = kMessages - 1; i >= 0; --i) {  // waits out of order
      const Batch g = grads[static_cast<size_t>(i)].wait();
      EXPECT_TRUE(g.tensor().equal(torch::full({3, 1 + i % 4}, static_cast<double>(i)))) << i;
    }
    ch.wait_sends();
    for (auto& s : sends) EXPECT_TRUE(s.done());
  } else {
    std::vector<RecvHandle> acts;
    for (int i = 0; i < kMessages; ++i) acts.push_back(ch.irecv(peer, Stream::activation(), "activation " + std::to_string(i)));
    // Gradients travel while activations are still arriving (both directions in flight).
    for (int i = 0; i < kMessages; ++i) {
      ch.isend(peer, Stream::gradient(), Batch(torch::full({3, 1 + i % 4}, static_cast<double>(i))),
               "gradient " + std::to_string(i));
    }
    std::vector<RecvHandle> chunk1;
    for (int i = 0; i < kMessages; i += 3) chunk1.push_back(ch.irecv(peer, Stream::activation(1), "chunk 1"));
    for (int i = 0; i < kMessages; ++i) expect_same(acts[static_cast<size_t>(i)].wait(), activation(i), i);
    // ready() turns true without waiting once the message is here (the sender is done).
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!chunk1.back().ready() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(chunk1.back().ready());
    // Received activations are leaves that autograd can differentiate.
    const Batch first = acts[0].wait();
    (first[0] * 2).sum().backward();
    EXPECT_TRUE(first[0].grad().equal(torch::full_like(first[0], 2)));
    for (size_t k = 0; k < chunk1.size(); ++k) {
      EXPECT_TRUE(chunk1[k].wait().tensor().equal(torch::full({4}, -3 * static_cast<int>(k), torch::kInt)));
    }
    ch.wait_sends();
  }
  comm->world().barrier();
  comm->shutdown();
}

TEST(P2P, TuplesLayoutChangesAndManyInFlight) {
  const auto run = testing::spawn_workers("p2p_exchange", SpawnOptions{});
  EXPECT_TRUE(run.ok()) << run.summary();
}

// Skip-link messages where an optional skip stashed nothing: none travels in the header and
// takes no data. The stream's first message starts with none (an exact zero-byte receive), and
// later messages turn none into tensors and back (speculative receives of every size).
Batch skip_message(int i) {
  const auto x = torch::full({2, 1 + i}, static_cast<double>(i)).requires_grad_();
  switch (i % 4) {
    case 0: return Batch::tuple_with_none({torch::Tensor(), x});
    case 1: return Batch::tuple_with_none({x, torch::Tensor()});
    case 2: return Batch::tuple_with_none({torch::Tensor(), torch::Tensor()});
    default: return Batch::tuple_with_none({x, x.detach() * 2});
  }
}

PIPETRAIN_RANK_WORKER(p2p_none) {
  auto comm = test::connect_for_test();
  Channel& ch = comm->channel();
  constexpr int kMessages = 9;
  if (comm->rank() == 0) {
    for (int i = 0; i < kMessages; ++i) {
      ch.isend(1, Stream::skip_activation(0), skip_message(i), "skip " + std::to_string(i));
    }
    ch.wait_sends();
  } else {
    std::vector<RecvHandle> got;
    for (int i = 0; i < kMessages; ++i) {
      got.push_back(ch.irecv(0, Stream::skip_activation(0), "skip " + std::to_string(i)));
    }
    for (int i = 0; i < kMessages; ++i) {
      const Batch b = got[static_cast<size_t>(i)].wait();
      const Batch want = skip_message(i);
      ASSERT_EQ(b.size(), want.size()) << "message " << i;
      EXPECT_FALSE(b.atomic());
      for (size_t k = 0; k < want.size(); ++k) {
        ASSERT_EQ(b[k].defined(), want[k].defined()) << "message " << i << " value " << k;
        if (!want[k].defined()) continue;
        EXPECT_TRUE(b[k].equal(want[k].detach())) << "message " << i << " value " << k;
        EXPECT_EQ(b[k].requires_grad(), want[k].requires_grad()) << "message " << i << " value " << k;
      }
    }
  }
  comm->world().barrier();
  comm->shutdown();
}

TEST(P2P, NoneTravelsInTuples) {
  const auto run = testing::spawn_workers("p2p_none", SpawnOptions{});
  EXPECT_TRUE(run.ok()) << run.summary();
}

PIPETRAIN_RANK_WORKER(p2p_timeout) {
  auto comm = test::connect_for_test();
  if (comm->rank() == 1) {
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->channel().irecv(0, Stream::activation(), "activation of micro-batch 5").wait(1000ms);
      ADD_FAILURE() << "expected TimeoutError";
    } catch (const TimeoutError& e) {
      const std::string text = e.what();
      EXPECT_NE(text.find("stage 1 (rank 1): recv activation of micro-batch 5 from stage 0 (rank 0) timed out after 1 s"),
                std::string::npos)
          << text;
    }
    // At least the 1 s asked for; no upper bound (a busy machine can take longer to wake the
    // rank): the message shows the 1 s wait ended it, not the 20 s default of the others.
    EXPECT_GE(std::chrono::steady_clock::now() - start, 1000ms);
    // The channel stays failed: later operations say so at once instead of hanging.
    EXPECT_THROW(comm->channel().irecv(0, Stream::activation(), "next").wait(1000ms), CommError);
  }
  comm->world().barrier();  // rank 0 waits here, sending nothing
}

TEST(P2P, TimeoutNamesBothEnds) {
  const auto run = testing::spawn_workers("p2p_timeout", SpawnOptions{});
  EXPECT_TRUE(run.ok()) << run.summary();
}

PIPETRAIN_RANK_WORKER(p2p_single_process) {
  // world size 1: no peers, a free port, groups of one.
  auto comm = connect(rank_info_from_env());
  EXPECT_EQ(comm->world_size(), 1);
  std::vector<torch::Tensor> t{torch::ones({3})};
  comm->world().all_reduce(t);
  EXPECT_TRUE(t[0].equal(torch::ones({3})));
  EXPECT_THROW(comm->channel().isend(0, Stream::activation(), Batch(t[0]), "x"), ConfigError);
}

TEST(P2P, SingleProcessNeedsNoPeers) {
  SpawnOptions o;
  o.nproc = 1;
  const auto run = testing::spawn_workers("p2p_single_process", o);
  EXPECT_TRUE(run.ok()) << run.summary();
}

}  // namespace
}  // namespace pipetrain::comm
