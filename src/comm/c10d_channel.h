// The point-to-point channel over a c10d ProcessGroupGloo: header protocol, speculative
// receives, asynchronous sends completed by one thread per destination.
//
// Protocol of one stream (sender s, receiver r), for message n with layout L(n):
//
//   s: slot i < k(n-1): tensor i if it fits c_i, else a zero-byte placeholder
//      slot 0:          control(n)  (24 bytes; + L(n) when it differs from L(n-1))
//      slot i:          tensor i, when it did not go into the speculative buffer
//                       (nothing for none, an undefined tensor: it has no data)
//   r: spec(n): one byte buffer of capacity c_i per tensor of L(n-1), posted as soon as
//      L(n-1) is known (before anyone waits); exact receives for what did not fit.
//
// c_i is slot i's high-water size over messages 0..n-1, which both ends know (see
// c10d_recv_stream.h). Gloo delivers only into posted receives and accepts a message shorter
// than the buffer, so while layouts stay within the high-water mark (constant shapes, or
// variable sequence lengths after the longest) the data lands while the receiver computes,
// with no extra round trip. Messages on one slot match in order, so nothing ever mixes, and
// no receive is left posted (Gloo would spin on a posted buffer that was freed).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "c10d_compat.h"

#include "c10d_recv_stream.h"
#include "fault_state.h"
#include "pipetrain/comm/channel.h"
#include "pipetrain/comm/message_header.h"
#include "pipetrain/comm/options.h"
#include "work_wait.h"

namespace pipetrain::comm::detail {

class C10dChannel final : public Channel, public std::enable_shared_from_this<C10dChannel> {
 public:
  // `up` carries the messages from a lower rank to a higher one, `down` the others (see pg_for).
  C10dChannel(ProcessGroupPtr up, ProcessGroupPtr down, int rank, int world_size,
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

  // One process group per direction: Gloo sends from the calling thread under the pair's lock,
  // which the process's Gloo thread holds while it reads an arriving message. With one group, a
  // stage sending an activation waited for its Gloo thread to finish reading the gradient that
  // came the other way, and on a busy core that thread may wait a whole scheduler slice (5 ms
  // stalls in about one send per step). Two groups give each direction its own pair and lock.
  const ProcessGroupPtr& pg_for(int src, int dst) const { return src < dst ? up_ : down_; }
  ProcessGroupPtr up_, down_;
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
