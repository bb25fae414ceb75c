// What one rank knows about lost peers, shared by its monitor, channel and groups: the first
// fault, each peer's status, and the waits to interrupt when a fault arrives.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "pipetrain/comm/fault.h"

namespace pipetrain::comm::detail {

class FaultState {
 public:
  // Records a fault. The first one becomes fault(); every one wakes the waiters and calls
  // the abort callbacks registered at that moment. A Left fault is only recorded as the
  // peer's status (it does not fail operations by itself).
  void raise(const Fault& fault);

  std::optional<Fault> fault() const;
  // What is known about `rank` (Died, Failed, Unresponsive or Left), if anything.
  std::optional<Fault> status_of(int rank) const;

  // Registers `abort` to be called once if a fault is raised while the returned guard lives
  // (at once when a fault is already set). The guard unregisters on destruction.
  class AbortGuard {
   public:
    AbortGuard(FaultState* state, int id) : state_(state), id_(id) {}
    AbortGuard(const AbortGuard&) = delete;
    AbortGuard& operator=(const AbortGuard&) = delete;
    ~AbortGuard();

   private:
    FaultState* state_;
    int id_;
  };
  AbortGuard on_fault(std::function<void()> abort);

 private:
  mutable std::mutex mu_;
  std::optional<Fault> first_;
  std::map<int, Fault> status_;
  std::map<int, std::function<void()>> aborts_;
  int next_id_ = 0;
};

}  // namespace pipetrain::comm::detail
