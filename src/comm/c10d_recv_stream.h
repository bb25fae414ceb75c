// The receiving end of one stream over Gloo: posts control and data receives in message
// order and decodes headers in the background, so data lands while the stage computes.
//
// A progress thread waits for control message n as soon as it is posted; when it arrives it
// posts the exact data receives of n (if the layout changed) and the speculative data
// receives of n+1 (if already requested). Several early-posted receives therefore flow back
// to back: message n+1's data can arrive before anyone waits on message n.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fault_state.h"
#include "pipetrain/batch/batch.h"
#include "pipetrain/comm/message_header.h"
#include "pipetrain/comm/options.h"
#include "work_wait.h"

namespace pipetrain::comm::detail {

struct PendingRecv {
  uint64_t seq = 0;
  std::string what;
  torch::Tensor control;
  c10::intrusive_ptr<c10d::Work> control_work;
  bool decoded = false;
  bool data_posted = false;
  MessageLayout layout;
  std::vector<torch::Tensor> data;
  std::vector<c10::intrusive_ptr<c10d::Work>> data_works;
  std::vector<torch::Tensor> retired;  // speculative buffers completed by placeholders
  std::vector<c10::intrusive_ptr<c10d::Work>> retired_works;
  std::optional<Batch> result;
  std::exception_ptr error;
};

class RecvStream {
 public:
  using TagFn = std::function<int(size_t slot)>;
  RecvStream(c10::intrusive_ptr<c10d::ProcessGroup> pg, int rank, int src, uint32_t code, TagFn tag,
             const CommOptions& options, std::shared_ptr<FaultState> faults,
             std::function<void(std::exception_ptr)> on_error);
  ~RecvStream();

  // Posts the receive of the next message (engine thread).
  std::shared_ptr<PendingRecv> post(const std::string& what, const OpDesc& op);
  // Waits for message p (engine thread); `op` names it in errors.
  Batch wait(const std::shared_ptr<PendingRecv>& p, Clock::time_point deadline, const OpDesc& op);
  // Stops the progress thread. Returns false when receives are still posted in Gloo, whose
  // buffers must then outlive the process group.
  bool close();

 private:
  void run();
  void decode(PendingRecv& p);  // under mu_
  void post_data(PendingRecv& p, const MessageLayout& layout);

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int rank_;
  int src_;
  uint32_t code_;
  TagFn tag_;
  CommOptions options_;
  std::shared_ptr<FaultState> faults_;
  std::function<void(std::exception_ptr)> on_error_;

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_request_ = 0;
  uint64_t decoded_ = 0;  // controls read, in order
  std::optional<MessageLayout> last_layout_;
  std::map<uint64_t, std::shared_ptr<PendingRecv>> pending_;
  std::exception_ptr error_;
  c10::intrusive_ptr<c10d::Work> current_;  // the control the thread waits on
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pipetrain::comm::detail
