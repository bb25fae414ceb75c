// Shared state of the ranks of one InProcessHub: mailboxes, collective rounds, faults.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "fault_state.h"
#include "pipetrain/comm/channel.h"
#include "pipetrain/comm/group.h"
#include "pipetrain/comm/options.h"
#include "pipetrain/comm/topology.h"
#include "work_wait.h"

namespace pipetrain::comm::detail {

// One collective at a time per group: members arrive, the last one completes the round,
// each copies the result out, the last one to leave opens the next round.
struct GroupRounds {
  std::vector<int> ranks;
  uint64_t round = 0;
  int arrived = 0;
  int left = 0;
  bool complete = false;
  std::string signature;  // what the first member called, to catch mismatched calls
  torch::Tensor acc;
  std::set<int> arrived_ranks;
  std::map<int, uint64_t> next_round;  // per member
};

struct Mailbox {
  uint64_t next_send = 0;
  uint64_t next_recv = 0;
  struct Message {
    std::vector<torch::Tensor> tensors;
    std::vector<bool> requires_grad;
    bool atomic = true;
  };
  std::map<uint64_t, Message> messages;
};

struct HubState {
  HubState(int world, CommOptions opts, bool copy_tensors);

  int world_size;
  CommOptions options;
  bool copy;
  std::shared_ptr<FaultState> faults = std::make_shared<FaultState>();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> taken;
  std::vector<torch::Device> devices;
  std::map<std::tuple<int, int, uint32_t>, Mailbox> mailboxes;  // (src, dst, stream code)
  std::map<std::string, std::shared_ptr<GroupRounds>> groups;

  // Blocks until ready() (checked first, so a delivered message wins over a fault), a fault
  // (PeerError) or the deadline (TimeoutError). `op` is built lazily for the message.
  template <typename Ready, typename Describe>
  void wait(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Ready&& ready,
            Describe&& describe) {
    while (!ready()) {
      if (faults->fault()) {
        const OpDesc op = describe();
        lock.unlock();
        throw_fault(*faults, op);
      }
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
        const OpDesc op = describe();
        lock.unlock();
        throw_timeout(*faults, op);
      }
    }
  }
};

std::unique_ptr<Channel> make_inprocess_channel(std::shared_ptr<HubState> hub, int rank);
std::shared_ptr<Group> make_inprocess_group(std::shared_ptr<HubState> hub, int rank, const GroupSpec& spec);

}  // namespace pipetrain::comm::detail
