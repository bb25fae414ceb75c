// The in-process channel: mailboxes between threads, same contract as the Gloo channel.
#include "hub_state.h"
#include "pipetrain/comm/message_header.h"
#include "pipetrain/error.h"

namespace pipetrain::comm::detail {
namespace {

class DoneSend final : public SendState {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool done() const override { return true; }
};

class InProcessRecv final : public RecvState {
 public:
  InProcessRecv(std::shared_ptr<HubState> hub, std::tuple<int, int, uint32_t> key, uint64_t seq, OpDesc op)
      : hub_(std::move(hub)), key_(key), seq_(seq), op_(std::move(op)) {}

  bool ready() const override {
    if (result_) return true;
    std::lock_guard<std::mutex> lock(hub_->mu);
    auto it = hub_->mailboxes.find(key_);
    return it != hub_->mailboxes.end() && it->second.messages.count(seq_) > 0;
  }

  Batch wait(std::chrono::milliseconds timeout) override {
    if (result_) return *result_;
    Mailbox::Message message;
    {
      std::unique_lock<std::mutex> lock(hub_->mu);
      Mailbox& box = hub_->mailboxes[key_];
      OpDesc op = op_;
      op.timeout = timeout;
      hub_->wait(lock, Clock::now() + timeout, [&] { return box.messages.count(seq_) > 0; },
                 [&] { return op; });
      auto it = box.messages.find(seq_);
      message = std::move(it->second);
      box.messages.erase(it);
    }
    const torch::Device device = hub_->devices[static_cast<size_t>(std::get<1>(key_))];
    for (size_t i = 0; i < message.tensors.size(); ++i) {
      torch::Tensor& t = message.tensors[i];
      if (!t.defined()) continue;  // none (an optional skip) stays none
      if (t.device() != device) t = t.to(device);
      if (message.requires_grad[i] && t.is_floating_point()) t.requires_grad_(true);
    }
    result_ = message.atomic ? Batch(message.tensors.front()) : Batch::tuple_with_none(std::move(message.tensors));
    return *result_;
  }

 private:
  std::shared_ptr<HubState> hub_;
  std::tuple<int, int, uint32_t> key_;
  uint64_t seq_;
  OpDesc op_;
  std::optional<Batch> result_;
};

class InProcessChannel final : public Channel {
 public:
  InProcessChannel(std::shared_ptr<HubState> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size; }
  std::chrono::milliseconds timeout() const override { return hub_->options.timeout(); }

  SendHandle isend(int dst, Stream stream, const Batch& batch, const std::string& what) override {
    const OpDesc op = describe("send", what, dst);
    const uint32_t code = stream.code();
    check_no_fault(*hub_->faults, op);
    MessageLayout::of(batch);  // the same limits as across processes
    Mailbox::Message message;
    message.atomic = batch.atomic();
    for (const torch::Tensor& t : batch.tensors()) {
      if (!t.defined()) {  // none, as the Gloo channel sends it
        message.tensors.emplace_back();
        message.requires_grad.push_back(false);
        continue;
      }
      torch::Tensor value = t.detach();
      message.tensors.push_back(hub_->copy ? value.clone() : value);
      message.requires_grad.push_back(t.requires_grad());
    }
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      Mailbox& box = hub_->mailboxes[{rank_, dst, code}];
      box.messages[box.next_send++] = std::move(message);
    }
    hub_->cv.notify_all();
    return SendHandle(std::make_shared<DoneSend>(), timeout());
  }

  RecvHandle irecv(int src, Stream stream, const std::string& what) override {
    const OpDesc op = describe("recv", what, src);
    const uint32_t code = stream.code();
    check_no_fault(*hub_->faults, op);
    uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      seq = hub_->mailboxes[{src, rank_, code}].next_recv++;
    }
    return RecvHandle(std::make_shared<InProcessRecv>(hub_, std::make_tuple(src, rank_, code), seq, op),
                      timeout());
  }

  void wait_sends() override {}

 private:
  OpDesc describe(const std::string& verb, const std::string& what, int peer) const {
    if (peer < 0 || peer >= hub_->world_size || peer == rank_) {
      throw ConfigError((verb == "send" ? "destination" : "source") + std::string(" rank ") +
                        std::to_string(peer) + " is not another rank of " +
                        std::to_string(hub_->world_size) + " (this is rank " + std::to_string(rank_) + ")");
    }
    OpDesc op;
    op.namer = &hub_->options.rank_namer();
    op.self = rank_;
    op.action = verb + " " + what + (verb == "send" ? " to " : " from ") + hub_->options.rank_namer()(peer);
    op.peer = peer;
    op.timeout = hub_->options.timeout();
    return op;
  }

  std::shared_ptr<HubState> hub_;
  int rank_;
};

}  // namespace

std::unique_ptr<Channel> make_inprocess_channel(std::shared_ptr<HubState> hub, int rank) {
  return std::make_unique<InProcessChannel>(std::move(hub), rank);
}

}  // namespace pipetrain::comm::detail
