// Point-to-point transport of micro-batch values between stages: asynchronous sends and
// early-posted receives, each waited on with a timeout.
//
// A stream is one direction of one kind of traffic between two ranks (activations of model
// chunk c, or gradients of chunk c). Messages of a stream arrive in the order they were sent
// and never mix with another stream's. The receiver posts irecv() in the same order as the
// sender's isend() calls on that stream; it may post them early (before the data is needed)
// and wait on the handles later, in any order.
//
//   stage 0                              stage 1
//   h = ch.isend(1, Stream::activation(), y, "activation of micro-batch 5");
//        ...compute continues...         r = ch.irecv(0, Stream::activation(), "...");  // early
//                                        ...other work...
//                                        Batch x = r.wait();   // TimeoutError after timeout
//   ch.wait_sends();  // end of the step
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "pipetrain/batch/batch.h"

namespace pipetrain::comm {

enum class StreamKind : uint8_t { Activation = 0, Gradient = 1, Aux = 2, SkipActivation = 3, SkipGradient = 4 };

// Model chunks (virtual stages of interleaved schedules) per stream kind: 0 .. kMaxChunks-1.
constexpr int kMaxChunks = 1024;

struct Stream {
  StreamKind kind = StreamKind::Activation;
  int chunk = 0;  // the model chunk the message belongs to (0 without interleaving)

  static Stream activation(int chunk = 0) { return {StreamKind::Activation, chunk}; }
  static Stream gradient(int chunk = 0) { return {StreamKind::Gradient, chunk}; }
  // Anything else (e.g. outputs of evaluation travelling to another stage).
  static Stream aux(int id = 0) { return {StreamKind::Aux, id}; }
  // Skip connections: the stashed tensors of skip link `link` (runtime/skip_links.h), and
  // their gradients going back.
  static Stream skip_activation(int link) { return {StreamKind::SkipActivation, link}; }
  static Stream skip_gradient(int link) { return {StreamKind::SkipGradient, link}; }

  // A number unique per (kind, chunk); ConfigError when chunk is outside [0, kMaxChunks).
  uint32_t code() const;
  // "activation stream (chunk 0)"
  std::string describe() const;
  bool operator==(const Stream& o) const { return kind == o.kind && chunk == o.chunk; }
};

namespace detail {
// Implementation side of the handles (one per channel kind).
class SendState {
 public:
  virtual ~SendState() = default;
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  virtual bool done() const = 0;
};
class RecvState {
 public:
  virtual ~RecvState() = default;
  virtual Batch wait(std::chrono::milliseconds timeout) = 0;
  virtual bool ready() const = 0;
};
}  // namespace detail

// A send in flight. Dropping the handle does not cancel the send: the channel keeps the
// tensors alive until the transfer completes.
class SendHandle {
 public:
  SendHandle() = default;
  SendHandle(std::shared_ptr<detail::SendState> state, std::chrono::milliseconds timeout)
      : state_(std::move(state)), timeout_(timeout) {}
  // Blocks until the data has left this process (the peer posted its receive). Raises
  // TimeoutError / PeerError naming both ends, or the error the transfer met.
  void wait() const { wait(timeout_); }
  void wait(std::chrono::milliseconds timeout) const;
  // Whether the transfer has completed (successfully or not); never blocks.
  bool done() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::SendState> state_;
  std::chrono::milliseconds timeout_{0};
};

// A posted receive. wait() returns the batch (again on later calls).
class RecvHandle {
 public:
  RecvHandle() = default;
  RecvHandle(std::shared_ptr<detail::RecvState> state, std::chrono::milliseconds timeout)
      : state_(std::move(state)), timeout_(timeout) {}
  Batch wait() const { return wait(timeout_); }
  Batch wait(std::chrono::milliseconds timeout) const;
  // Whether the message has arrived, so wait() no longer waits for the sender (over Gloo: its
  // header has, and the data is right behind it); never blocks.
  bool ready() const { return state_ != nullptr && state_->ready(); }
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::RecvState> state_;
  std::chrono::milliseconds timeout_{0};
};

// The transport between ranks. One thread uses a channel at a time (a stage's executor);
// handles belong to that thread too.
class Channel {
 public:
  virtual ~Channel() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The timeout of handles' wait() without an argument.
  virtual std::chrono::milliseconds timeout() const = 0;

  // Starts sending `batch` to rank `dst` and returns at once. The tensors must not be
  // modified in place until the handle is done; the receiver gets its own copy, with the
  // same dtypes, shapes, atomic/tuple form and requires_grad flags. `what` names the message
  // in errors ("activation of micro-batch 5"). BatchError for a batch that cannot travel,
  // PeerError when dst is already known to be lost.
  virtual SendHandle isend(int dst, Stream stream, const Batch& batch, const std::string& what) = 0;
  // Posts the receive of the next message of `stream` from rank `src`.
  virtual RecvHandle irecv(int src, Stream stream, const std::string& what) = 0;
  // Waits until every send so far has completed (each within the timeout).
  virtual void wait_sends() = 0;
};

}  // namespace pipetrain::comm
