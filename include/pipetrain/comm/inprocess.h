// Communicators for ranks that are threads of one process: the same Channel and Group
// interfaces as connect(), for fast single-process tests of a multi-stage engine.
//
//   auto hub = comm::InProcessHub::create(2);
//   std::thread t0([&] { auto c = hub->endpoint(0); run_stage(*c); c->shutdown(); });
//   std::thread t1([&] { auto c = hub->endpoint(1); run_stage(*c); c->shutdown(); });
//
// A thread that stops on an error (its endpoint is destroyed while an exception unwinds, or
// it calls report_failure) makes every wait of the other ranks fail with PeerError naming it.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "pipetrain/comm/communicator.h"

namespace pipetrain::comm {

namespace detail {
struct HubState;
}

class InProcessHub {
 public:
  // `copy`: the receiver gets its own copy of every tensor, as across processes (the sender
  // may then reuse its tensors at once). Without it the receiver shares the sender's
  // storage (detached), which is faster but unsafe if either side modifies it in place.
  static std::shared_ptr<InProcessHub> create(int world_size, CommOptions options = {}, bool copy = true);

  int world_size() const;
  // The communicator of `rank`, used by that rank's thread. UsageError when taken twice.
  std::unique_ptr<Communicator> endpoint(int rank);
  // Received tensors of `rank` are placed on `device` (default: CommOptions::device).
  void set_device(int rank, torch::Device device);
  // Marks `rank` failed: every pending and later wait of the other ranks raises PeerError.
  void fail(int rank, const std::string& reason);
  std::optional<Fault> fault() const;

 private:
  explicit InProcessHub(std::shared_ptr<detail::HubState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::HubState> state_;
};

}  // namespace pipetrain::comm
