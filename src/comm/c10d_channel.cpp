// The point-to-point channel over c10d/Gloo (protocol drawn in c10d_channel.h).
#include "c10d_channel.h"

#include <cstring>

#include "pipetrain/error.h"

namespace pipetrain::comm::detail {

struct C10dChannel::SendStream {
  uint64_t next_seq = 0;
  std::optional<MessageLayout> prev;
  std::vector<int64_t> caps;  // high-water bytes per slot, as the receiver computes them
};

struct C10dChannel::PendingSend final : SendState {
  OpDesc op;
  std::vector<torch::Tensor> keep;  // alive until Gloo has sent them
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  Clock::time_point deadline;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
      error = e;
      keep.clear();
      works.clear();
    }
    cv.notify_all();
  }
  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return finished; })) {
      throw TimeoutError((*op.namer)(op.self) + ": " + op.action + " did not complete within " +
                         format_duration(timeout) + " (the receiver has not posted its receive)");
    }
    if (error) std::rethrow_exception(error);
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(mu);
    return finished;
  }
};

// Waits on the sends to one destination in the order they were posted, so that tensors are
// released as soon as Gloo is done with them, whether or not anyone holds the handle.
class C10dChannel::Completer {
 public:
  Completer(std::shared_ptr<FaultState> faults, std::function<void(std::exception_ptr)> on_error)
      : faults_(std::move(faults)), on_error_(std::move(on_error)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Completer() { stop(true); }

  void push(std::shared_ptr<PendingSend> p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(p));
    }
    cv_.notify_one();
  }
  // Abandon: abort the current wait and fail what is queued. Otherwise drain the queue.
  void stop(bool abandon) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
      abandon_ = abandon_ || abandon;
      if (abandon_ && current_) {
        try {
          current_->abort();
        } catch (...) {
        }
      }
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    for (;;) {
      std::shared_ptr<PendingSend> p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        if (queue_.empty()) return;
        p = queue_.front();
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        for (auto& work : p->works) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (abandon_) throw CommError((*p->op.namer)(p->op.self) + ": " + p->op.action +
                                          " abandoned: the channel was closed");
            current_ = work;
          }
          wait_p2p(work, p->deadline, *faults_, p->op);
        }
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        current_.reset();
      }
      if (error) on_error_(error);
      p->finish(error);
    }
  }

  std::shared_ptr<FaultState> faults_;
  std::function<void(std::exception_ptr)> on_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<PendingSend>> queue_;
  c10::intrusive_ptr<c10d::Work> current_;
  bool stopping_ = false;
  bool abandon_ = false;
  std::thread thread_;
};

namespace {

class RecvStateImpl final : public RecvState {
 public:
  RecvStateImpl(std::shared_ptr<C10dChannel> channel, RecvStream* stream, std::shared_ptr<PendingRecv> p, OpDesc op)
      : channel_(std::move(channel)), stream_(stream), p_(std::move(p)), op_(std::move(op)) {}
  Batch wait(std::chrono::milliseconds timeout) override {
    OpDesc op = op_;
    op.timeout = timeout;
    if (channel_->closed()) throw UsageError((*op.namer)(op.self) + ": " + op.action + ": the channel is closed");
    return stream_->wait(p_, Clock::now() + timeout, op);
  }
  bool ready() const override { return !channel_->closed() && stream_->ready(*p_); }

 private:
  std::shared_ptr<C10dChannel> channel_;  // keeps the stream alive
  RecvStream* stream_;
  std::shared_ptr<PendingRecv> p_;
  OpDesc op_;
};

}  // namespace

C10dChannel::C10dChannel(ProcessGroupPtr up, ProcessGroupPtr down, int rank, int world_size,
                         CommOptions options, std::shared_ptr<FaultState> faults)
    : up_(std::move(up)),
      down_(std::move(down)),
      rank_(rank),
      world_size_(world_size),
      options_(std::move(options)),
      faults_(std::move(faults)),
      placeholder_(torch::empty({0}, torch::kUInt8)) {}

C10dChannel::~C10dChannel() { close(); }

void C10dChannel::close() {
  if (closed_) return;
  closed_ = true;
  bool failed = faults_->fault().has_value();
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    failed = failed || broken_ != nullptr;
  }
  for (auto& [dst, c] : completers_) c->stop(/*abandon=*/failed);
  completers_.clear();
  for (auto& [key, stream] : recv_streams_) {
    // Receives still posted in Gloo keep buffers that Gloo may write to: keep them.
    if (!stream->close()) {
      failed = true;
      (void)stream.release();
    }
  }
  // Gloo may still write into posted receive buffers, or a lost peer may keep a worker
  // blocked: after a failure the process group is abandoned rather than torn down.
  if (failed) {
    (void)up_.release();
    (void)down_.release();
  }
}

int C10dChannel::tag(uint32_t code, int src, int dst, size_t slot) const {
  const int direction = src < dst ? 0 : 1;
  return static_cast<int>((code * 2 + static_cast<uint32_t>(direction)) * (kMaxMessageTensors + 1) + slot);
}

OpDesc C10dChannel::describe(const std::string& verb, const std::string& what, int peer,
                             std::chrono::milliseconds timeout) const {
  OpDesc op;
  op.namer = &options_.rank_namer();
  op.self = rank_;
  op.action = verb + " " + what + (verb == "send" ? " to " : " from ") + options_.rank_namer()(peer);
  op.peer = peer;
  op.timeout = timeout;
  return op;
}

void C10dChannel::check_peer(int peer, const char* role) const {
  if (peer < 0 || peer >= world_size_ || peer == rank_) {
    throw ConfigError(std::string(role) + " rank " + std::to_string(peer) + " is not another rank of " +
                      std::to_string(world_size_) + " (this is rank " + std::to_string(rank_) + ")");
  }
}

void C10dChannel::mark_broken(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (!broken_) broken_ = error;
}

void C10dChannel::check_usable(const OpDesc& op) {
  if (closed_) throw UsageError((*op.namer)(op.self) + ": " + op.action + ": the channel is closed");
  check_no_fault(*faults_, op);
  std::exception_ptr broken;
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    broken = broken_;
  }
  if (!broken) return;
  try {
    std::rethrow_exception(broken);
  } catch (const TimeoutError& e) {
    throw TimeoutError((*op.namer)(op.self) + ": " + op.action + " cannot start: an earlier operation failed: " + e.what());
  } catch (const std::exception& e) {
    throw PeerError((*op.namer)(op.self) + ": " + op.action + " cannot start: an earlier operation failed: " + e.what());
  }
}

C10dChannel::Completer& C10dChannel::completer(int dst) {
  auto& c = completers_[dst];
  if (!c) c = std::make_unique<Completer>(faults_, [this](std::exception_ptr e) { mark_broken(e); });
  return *c;
}

SendHandle C10dChannel::isend(int dst, Stream stream, const Batch& batch, const std::string& what) {
  check_peer(dst, "destination");
  const uint32_t code = stream.code();
  auto p = std::make_shared<PendingSend>();
  p->op = describe("send", what, dst, options_.timeout());
  check_usable(p->op);
  const MessageLayout layout = MessageLayout::of(batch);
  std::vector<torch::Tensor> tensors;
  tensors.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].defined()) {  // none: a zero-byte placeholder, sent only to fill a speculative slot
      tensors.push_back(placeholder_);
      continue;
    }
    torch::Tensor t = batch[i].detach();
    if (!t.device().is_cpu()) t = t.to(torch::kCPU);  // Gloo moves host memory
    tensors.push_back(t.is_contiguous() ? t : t.contiguous());
  }
  SendStream& ss = send_streams_[{dst, code}];
  const bool changed = !ss.prev || *ss.prev != layout;
  ControlMessage control{ss.next_seq, code, changed ? std::optional<MessageLayout>(layout) : std::nullopt};
  const std::vector<uint8_t> bytes = encode_control(control);
  torch::Tensor control_tensor = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(control_tensor.data_ptr<uint8_t>(), bytes.data(), bytes.size());

  auto post = [&](const torch::Tensor& t, size_t slot) {
    std::vector<at::Tensor> one{t};
    p->works.push_back(pg_for(rank_, dst)->send(one, dst, tag(code, rank_, dst, slot)));
    p->keep.push_back(t);
  };
  try {
    // The receiver posted one speculative buffer per tensor of the previous message
    // (c10d_recv_stream.h): fill each with the tensor when it fits, else a placeholder.
    std::vector<bool> sent(tensors.size(), false);
    const size_t speculative = ss.prev ? ss.prev->tensors.size() : 0;
    for (size_t i = 0; i < speculative; ++i) {
      if (fits_speculative(layout, ss.caps, i)) {
        post(tensors[i], i + 1);
        sent[i] = true;
      } else {
        post(placeholder_, i + 1);
      }
    }
    post(control_tensor, 0);
    // None has no data: the receiver posts nothing for it beyond the speculative slots.
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!sent[i] && !layout.tensors[i].none) post(tensors[i], i + 1);
    }
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    try {
      throw_failure(*faults_, p->op, what_of(e));
    } catch (...) {
      mark_broken(std::current_exception());
      throw;
    }
  }
  ss.next_seq++;
  ss.prev = layout;
  grow_caps(ss.caps, layout);
  p->deadline = Clock::now() + options_.timeout();
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                  [](const auto& s) { return s->done(); }),
                   in_flight_.end());
  in_flight_.push_back(p);
  completer(dst).push(p);
  return SendHandle(p, options_.timeout());
}

RecvHandle C10dChannel::irecv(int src, Stream stream, const std::string& what) {
  check_peer(src, "source");
  const uint32_t code = stream.code();
  const OpDesc op = describe("recv", what, src, options_.timeout());
  check_usable(op);
  auto& slot = recv_streams_[{src, code}];
  if (!slot) {
    slot = std::make_unique<RecvStream>(
        pg_for(src, rank_), rank_, src, code, [this, code, src](size_t s) { return tag(code, src, rank_, s); }, options_, faults_,
        [this](std::exception_ptr e) { mark_broken(e); });
  }
  std::shared_ptr<PendingRecv> p;
  try {
    p = slot->post(what, op);
  } catch (...) {
    mark_broken(std::current_exception());
    throw;
  }
  return RecvHandle(std::make_shared<RecvStateImpl>(shared_from_this(), slot.get(), p, op), options_.timeout());
}

void C10dChannel::wait_sends() {
  for (auto& p : in_flight_) p->wait(options_.timeout() + std::chrono::seconds(1));
  in_flight_.clear();
}

}  // namespace pipetrain::comm::detail
