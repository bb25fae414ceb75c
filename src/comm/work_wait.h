// Waiting on c10d work items with a deadline, interrupted by peer faults, and turning every
// way they can fail into TimeoutError / PeerError messages that name both ends.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "fault_state.h"
#include "pipetrain/comm/options.h"

namespace pipetrain::comm::detail {

using Clock = std::chrono::steady_clock;

// One operation, for messages: "<self>: <action> timed out after 30 s".
struct OpDesc {
  const RankNamer* namer = nullptr;
  int self = -1;
  std::string action;  // "recv activation of micro-batch 5 from stage 0 (rank 0)"
  int peer = -1;       // the rank the operation waits on, -1 for collectives
  std::vector<int> members;  // collectives: the group's ranks
  std::chrono::milliseconds timeout{0};
  // The work runs on a device stream (NCCL): its future completes when it is queued and wait()
  // only orders streams, so wait_collective polls isCompleted() instead.
  bool device_side = false;
};

// An exception's message, without the C++ backtrace that a c10::Error carries.
std::string what_of(const std::exception& e);
std::string what_of(std::exception_ptr e);

// Raises PeerError when a fault is already known (call before starting an operation).
void check_no_fault(const FaultState& faults, const OpDesc& op);

// Waits for a Gloo send/recv work. A fault aborts the wait; gloo's own errors are mapped.
void wait_p2p(const c10::intrusive_ptr<c10d::Work>& work, Clock::time_point deadline,
              FaultState& faults, const OpDesc& op);

// Waits for a collective work: through its future, or for device-side work by polling
// isCompleted() until the deadline or a fault, after which the work is aborted (NCCL's abort
// ends its communicators' kernels, so that nothing waits on them for ever).
void wait_collective(const c10::intrusive_ptr<c10d::Work>& work, Clock::time_point deadline,
                     FaultState& faults, const OpDesc& op);

// The error for an operation that failed because of `cause` (an exception from c10d/Gloo):
// waits a moment for the monitor to explain the peer's state, then throws.
[[noreturn]] void throw_failure(FaultState& faults, const OpDesc& op, const std::string& cause);
[[noreturn]] void throw_timeout(const FaultState& faults, const OpDesc& op);
[[noreturn]] void throw_fault(const FaultState& faults, const OpDesc& op);

}  // namespace pipetrain::comm::detail
