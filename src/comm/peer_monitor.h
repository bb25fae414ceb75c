// Liveness of the other ranks, independent of any operation: one TCP connection to every
// peer carrying heartbeats, a goodbye on clean shutdown, and failure reasons.
//
// The kernel closes a killed process's sockets at once, so a SIGKILLed peer is seen within
// milliseconds (connection closed without a goodbye), even by ranks that do not exchange
// data with it; a hung host or broken link is seen when its heartbeats stop for the
// heartbeat timeout. Either way the FaultState wakes every wait of this rank.
//
//   rank r  --'P' every heartbeat_interval-->  rank q     ping
//           --'B'-->                                       goodbye (clean shutdown)
//           --'F' u32 n, n bytes-->                        failure with its reason
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fault_state.h"
#include "pipetrain/comm/options.h"
#include "socket_util.h"

namespace c10d {
class Store;
}

namespace pipetrain::comm::detail {

class PeerMonitor {
 public:
  // Connects to every other rank: publishes this rank's address in `store`, connects to the
  // higher ranks, accepts the lower ones, all before options.connect_timeout.
  PeerMonitor(c10d::Store& store, int rank, int world_size, const std::string& bind_address,
              const CommOptions& options, std::shared_ptr<FaultState> faults);
  ~PeerMonitor();  // stops the thread and closes the connections (sends nothing)

  void send_goodbye();
  void send_failure(const std::string& reason);

 private:
  struct Peer {
    int rank = -1;
    Fd fd;
    Clock::time_point last_seen;
    std::string inbox;  // bytes received but not yet parsed
    bool closed = false;
  };
  void run();
  void handle_readable(Peer& peer);
  void parse(Peer& peer);
  void broadcast(const std::string& bytes);

  int rank_;
  CommOptions options_;
  std::shared_ptr<FaultState> faults_;
  std::vector<Peer> peers_;
  std::mutex send_mu_;  // pings (monitor thread) and goodbye/failure (caller) share sockets
  Fd wake_read_, wake_write_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pipetrain::comm::detail
