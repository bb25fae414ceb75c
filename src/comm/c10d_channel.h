// The point-to-point channel over a c10d ProcessGroupGloo: header protocol, speculative
// receives, asynchronous sends completed by one thread per destination.
//
// Protocol of one stream (sender s, receiver r), for message n with layout L(n):
//
//   s: [placeholders]  control(n)          data(n)_0 .. data(n)_k-1
//   r: spec(n)         recv control(n)     exact(n) if L(n) != L(n-1)
//
// Every message sends a control message (24 bytes, plus the layout when it changed) on
// slot 0 of the stream and one Gloo message per tensor on slots 1..k. Gloo delivers only
// into posted receives, so the receiver posts the data receives of message n as soon as it
// knows L(n-1) ("speculative", spec(n)): when the layout is unchanged the data lands while
// the receiver computes, with no extra round trip. When it changed, the sender first sends
// a zero-byte placeholder on each slot of L(n-1) — it knows exactly what the receiver
// posted — which completes spec(n); the receiver reads L(n) from the control message and
// posts exact receives. Messages on one slot match in order, so nothing ever mixes, and no
// receive is left posted (Gloo would spin on a posted buffer that was freed).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "c10d_recv_stream.h"
#include "fault_state.h"
#include "pipetrain/comm/channel.h"
#include "pipetrain/comm/message_header.h"
#include "pipetrain/comm/options.h"
#include "work_wait.h"

namespace pipetrain::comm::detail {

class C10dChannel final : public Channel, public std::enable_shared_from_this<C10dChannel> {
 public:
  C10dChannel(c10::intrusive_ptr<c10d::ProcessGroup> pg, int rank, int world_size,
              CommOptions options, std::shared_ptr<FaultState> faults);
  ~C10dChannel() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::chrono::milliseconds timeout() const override { return options_.timeout(); }
  SendHandle isend(int dst, Stream stream, const Batch& batch, const std::string& what) override;
  RecvHandle irecv(int src, Stream stream, const std::string& what) override;
  void wait_sends() override;

  // Stops the send threads; after a failure it abandons what is in flight.
  void close();
  bool closed() const { return closed_; }

  struct PendingSend;

 private:
  struct SendStream;
  class Completer;

  int tag(uint32_t code, int src, int dst, size_t slot) const;
  OpDesc describe(const std::string& verb, const std::string& what, int peer,
                  std::chrono::milliseconds timeout) const;
  void check_peer(int peer, const char* role) const;
  void check_usable(const OpDesc& op);
  void mark_broken(std::exception_ptr error);
  Completer& completer(int dst);

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int rank_;
  int world_size_;
  CommOptions options_;
  std::shared_ptr<FaultState> faults_;
  torch::Tensor placeholder_;  // zero bytes
  std::map<std::pair<int, uint32_t>, std::unique_ptr<RecvStream>> recv_streams_;
  std::map<std::pair<int, uint32_t>, SendStream> send_streams_;
  std::map<int, std::unique_ptr<Completer>> completers_;
  std::vector<std::shared_ptr<PendingSend>> in_flight_;
  mutable std::mutex broken_mu_;
  std::exception_ptr broken_;
  bool closed_ = false;
};

}  // namespace pipetrain::comm::detail
