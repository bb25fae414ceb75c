// What one rank knows about lost peers.
#include "fault_state.h"

#include <vector>

namespace pipetrain::comm::detail {

void FaultState::raise(const Fault& fault) {
  std::vector<std::function<void()>> to_call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = status_.find(fault.rank);
    // A goodbye or a reported failure explains the closed connection that follows it.
    if (it != status_.end() && it->second.kind != FaultKind::Unresponsive) return;
    status_[fault.rank] = fault;
    if (fault.kind == FaultKind::Left) return;
    if (!first_) first_ = fault;
    for (auto& [id, fn] : aborts_) to_call.push_back(fn);
  }
  for (auto& fn : to_call) fn();
}

std::optional<Fault> FaultState::fault() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

std::optional<Fault> FaultState::status_of(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = status_.find(rank);
  if (it == status_.end()) return std::nullopt;
  return it->second;
}

FaultState::AbortGuard FaultState::on_fault(std::function<void()> abort) {
  bool call_now = false;
  int id = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_) {
      call_now = true;
    } else {
      id = next_id_++;
      aborts_[id] = abort;
    }
  }
  if (call_now) abort();
  return AbortGuard(this, id);
}

FaultState::AbortGuard::~AbortGuard() {
  if (id_ < 0) return;
  std::lock_guard<std::mutex> lock(state_->mu_);
  state_->aborts_.erase(id_);
}

}  // namespace pipetrain::comm::detail
