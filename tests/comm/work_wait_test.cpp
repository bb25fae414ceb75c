// Waiting on device-side (NCCL) collectives, on the CPU: a fake Work stands for NCCL's, whose
// future completes when it is queued. Completion is polled; the deadline or a peer's fault aborts
// the work and names the operation, so a hung collective cannot hang the rank.
#include "comm/work_wait.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>

#include "pipetrain/error.h"

namespace pipetrain::comm::detail {
namespace {

using namespace std::chrono_literals;

// ProcessGroupNCCL's WorkNCCL as wait_collective sees it: its future completed when it was
// queued, isCompleted() asks the device, wait() only rethrows a recorded error, abort() ends the
// communicators (after which the work reports completion, with its error).
class FakeDeviceWork : public c10d::Work {
 public:
  FakeDeviceWork() : future_(c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get())) {
    future_->markCompleted(c10::IValue());
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  bool isCompleted() override {
    ++polls;
    return completed || aborted;
  }
  bool wait(std::chrono::milliseconds) override {
    if (aborted) throw std::runtime_error("NCCL communicator was aborted");
    if (error) throw std::runtime_error(*error);
    return true;
  }
  void abort() override { aborted = true; }

  std::atomic<bool> completed{false};
  std::atomic<bool> aborted{false};
  std::atomic<int> polls{0};
  std::optional<std::string> error;

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class DeviceSideWait : public ::testing::Test {
 protected:
  OpDesc op() const {
    OpDesc d;
    d.namer = &namer_;
    d.self = 1;
    d.action = "all-reduce (sum of 4 MiB) over the data-parallel group";
    d.members = {0, 1};
    d.timeout = 300ms;
    d.device_side = true;
    return d;
  }
  RankNamer namer_ = default_rank_name;
  FaultState faults_;
};

TEST_F(DeviceSideWait, ReturnsOnceTheDeviceFinishes) {
  auto work = c10::make_intrusive<FakeDeviceWork>();
  std::thread device([work] {
    std::this_thread::sleep_for(50ms);
    work->completed = true;
  });
  wait_collective(work, Clock::now() + 120s, faults_, op());  // a hang guard only
  device.join();
  EXPECT_FALSE(work->aborted);
  EXPECT_GT(work->polls.load(), 1);  // polled, not taken as done when queued
}

TEST_F(DeviceSideWait, AHungCollectiveTimesOutNamingTheOperationAndIsAborted) {
  auto work = c10::make_intrusive<FakeDeviceWork>();
  const auto start = Clock::now();
  try {
    wait_collective(work, start + 300ms, faults_, op());
    ADD_FAILURE() << "a collective that never finished was taken as done";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("all-reduce (sum of 4 MiB)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("timed out after"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 300ms);  // the deadline, and no upper bound: a cause, not a speed
  EXPECT_TRUE(work->aborted);
}

TEST_F(DeviceSideWait, APeersFaultEndsTheWaitAtOnceAndAbortsTheWork) {
  auto work = c10::make_intrusive<FakeDeviceWork>();
  std::thread monitor([this] {
    std::this_thread::sleep_for(100ms);
    faults_.raise(Fault{0, FaultKind::Died, "its connection closed"});
  });
  const auto start = Clock::now();
  try {
    // Ended by the fault (a PeerError), not by this deadline (a TimeoutError would escape).
    wait_collective(work, start + 120s, faults_, op());
    ADD_FAILURE() << "the wait outlived the peer's death";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 died"), std::string::npos) << e.what();
  }
  monitor.join();
  EXPECT_TRUE(work->aborted);
}

TEST_F(DeviceSideWait, AnErrorTheBackendRecordedIsACommErrorNamingTheOperation) {
  auto work = c10::make_intrusive<FakeDeviceWork>();
  work->completed = true;
  work->error = "NCCL error: unhandled system error";
  try {
    wait_collective(work, Clock::now() + 120s, faults_, op());
    ADD_FAILURE() << "the backend's error was lost";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("unhandled system error"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("all-reduce"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::comm::detail
