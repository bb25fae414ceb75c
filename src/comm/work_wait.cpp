// Waiting on c10d work items with deadlines and fault interruption.
#include "work_wait.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include <ATen/core/ivalue.h>

#include "pipetrain/error.h"

namespace pipetrain::comm::detail {
namespace {

// How long a failed operation waits for the monitor to say why the peer went away.
constexpr auto kExplainGrace = std::chrono::milliseconds(300);

std::string prefix(const OpDesc& op) { return (*op.namer)(op.self) + ": " + op.action; }

bool is_timeout_text(const std::string& text) {
  return text.find("Timed out") != std::string::npos || text.find("timed out") != std::string::npos ||
         text.find("Timeout") != std::string::npos;
}

struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool poked = false;
  void set(bool& flag) {
    {
      std::lock_guard<std::mutex> lock(mu);
      flag = true;
    }
    cv.notify_all();
  }
};

}  // namespace

std::string what_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return what_of(err);
  } catch (...) {
    return "unknown error";
  }
}

// What is known about the peer of a p2p operation, or about a member of a collective's group.
static std::optional<Fault> peer_status(const FaultState& faults, const OpDesc& op) {
  if (op.peer >= 0) return faults.status_of(op.peer);
  for (int r : op.members) {
    if (auto s = faults.status_of(r)) return s;
  }
  return std::nullopt;
}

[[noreturn]] void throw_fault(const FaultState& faults, const OpDesc& op) {
  auto own = peer_status(faults, op);
  auto first = faults.fault();
  std::string text = prefix(op) + " failed: ";
  if (first) {
    text += first->describe(*op.namer);
    if (own && own->rank != first->rank) text += "; " + own->describe(*op.namer);
  } else if (own) {
    text += own->describe(*op.namer);
  } else {
    text += "a peer was lost";
  }
  throw PeerError(text);
}

void check_no_fault(const FaultState& faults, const OpDesc& op) {
  // A peer that left cleanly is no fault here: it delivered everything before leaving.
  if (faults.fault()) throw_fault(faults, op);
}

[[noreturn]] void throw_timeout(const FaultState& faults, const OpDesc& op) {
  if (faults.fault()) throw_fault(faults, op);
  std::string text = prefix(op) + " timed out after " + format_duration(op.timeout);
  text += op.peer >= 0
              ? " (is " + (*op.namer)(op.peer) +
                    " alive and running the matching schedule? raise the communication timeout "
                    "if a step legitimately takes longer)"
              : " (a member is slow, hung or running another schedule; raise the "
                "communication timeout if a step legitimately takes longer)";
  throw TimeoutError(text);
}

[[noreturn]] void throw_failure(FaultState& faults, const OpDesc& op, const std::string& cause) {
  if (is_timeout_text(cause) && !faults.fault()) throw_timeout(faults, op);
  // The connection broke; the monitor usually knows within milliseconds whether the peer
  // died, failed with a reason or left, which makes a better message than Gloo's.
  const auto until = Clock::now() + kExplainGrace;
  while (!faults.fault() && !peer_status(faults, op) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (faults.fault() || peer_status(faults, op)) {
    try {
      throw_fault(faults, op);
    } catch (const PeerError& e) {
      throw PeerError(std::string(e.what()) + " [" + cause + "]");
    }
  }
  const std::string peer = op.peer >= 0 ? (*op.namer)(op.peer) : "a member of the group";
  throw PeerError(prefix(op) + " failed: the connection to " + peer + " broke [" + cause + "]");
}

void wait_p2p(const c10::intrusive_ptr<c10d::Work>& work, Clock::time_point deadline,
              FaultState& faults, const OpDesc& op) {
  check_no_fault(faults, op);
  auto guard = faults.on_fault([work] {
    try {
      work->abort();
    } catch (...) {
    }
  });
  // Past the deadline, still look once: a transfer that already completed succeeds.
  const auto left = std::max(std::chrono::milliseconds(1),
                             std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  bool completed = false;
  try {
    completed = work->wait(left);
  } catch (...) {
    throw_failure(faults, op, what_of(std::current_exception()));
  }
  if (!completed) throw_fault(faults, op);  // only an abort returns false
}

namespace {

void abort_work(const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->abort();
  } catch (...) {  // a backend without abort: the error thrown next says what happened
  }
}

void wait_device_side(const c10::intrusive_ptr<c10d::Work>& work, Clock::time_point deadline, FaultState& faults,
                      const OpDesc& op) {
  check_no_fault(faults, op);
  auto poked = std::make_shared<std::atomic<bool>>(false);
  auto guard = faults.on_fault([poked] { *poked = true; });
  // Short pauses first: most collectives end within microseconds of being polled.
  auto pause = std::chrono::microseconds(20);
  while (true) {
    bool done = false;
    try {
      done = work->isCompleted();
    } catch (...) {
      throw_failure(faults, op, what_of(std::current_exception()));
    }
    if (done) break;
    if (*poked) {
      abort_work(work);
      throw_fault(faults, op);
    }
    if (Clock::now() >= deadline) {
      abort_work(work);
      throw_timeout(faults, op);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  try {
    work->wait();  // complete: rethrows the error the backend recorded, if any
  } catch (...) {
    throw_failure(faults, op, what_of(std::current_exception()));
  }
}

}  // namespace

void wait_collective(const c10::intrusive_ptr<c10d::Work>& work, Clock::time_point deadline,
                     FaultState& faults, const OpDesc& op) {
  if (op.device_side) {
    wait_device_side(work, deadline, faults, op);
    return;
  }
  auto completion = std::make_shared<Completion>();
  work->getFuture()->addCallback([completion](c10::ivalue::Future&) { completion->set(completion->done); });
  auto guard = faults.on_fault([completion] { completion->set(completion->poked); });
  {
    std::unique_lock<std::mutex> lock(completion->mu);
    completion->cv.wait_until(lock, deadline, [&] { return completion->done || completion->poked; });
    if (!completion->done) {
      lock.unlock();
      if (completion->poked) throw_fault(faults, op);
      throw_timeout(faults, op);
    }
  }
  try {
    work->wait(std::chrono::milliseconds(10'000));  // already complete: rethrows its error, if any
  } catch (...) {
    throw_failure(faults, op, what_of(std::current_exception()));
  }
}

}  // namespace pipetrain::comm::detail
