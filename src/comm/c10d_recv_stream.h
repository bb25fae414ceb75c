// The receiving end of one stream over Gloo: posts control and data receives in message
// order and decodes headers in the background, so data lands while the stage computes.
//
// A progress thread waits for control message n as soon as it is posted; when it arrives it
// posts the exact data receives of n that the speculative ones could not hold, and the
// speculative data receives of n+1 (if already requested). Several early-posted receives therefore flow back
// to back: message n+1's data can arrive before anyone waits on message n.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "c10d_compat.h"

#include "fault_state.h"
#include "pipetrain/batch/batch.h"
#include "pipetrain/comm/message_header.h"
#include "pipetrain/comm/options.h"
#include "work_wait.h"

namespace pipetrain::comm::detail {

// Speculative receives use each slot's high-water size: both ends know every earlier layout
// of the stream, so both know the capacity c_i of the buffer posted on slot i for message n.
// The sender sends tensor i of message n straight into it when it fits (nbytes <= c_i;
// Gloo accepts a message shorter than the buffer) and a zero-byte placeholder otherwise.
// A shorter or equal layout thus costs no round trip; only growth beyond the high-water mark
// (or more tensors than before) waits for exact receives.
inline bool fits_speculative(const MessageLayout& layout, const std::vector<int64_t>& caps, size_t slot) {
  return slot < layout.tensors.size() && slot < caps.size() && layout.tensors[slot].nbytes() <= caps[slot];
}
inline void grow_caps(std::vector<int64_t>& caps, const MessageLayout& layout) {
  if (caps.size() < layout.tensors.size()) caps.resize(layout.tensors.size(), 0);
  for (size_t i = 0; i < layout.tensors.size(); ++i) caps[i] = std::max(caps[i], layout.tensors[i].nbytes());
}

struct PendingRecv {
  uint64_t seq = 0;
  std::string what;
  torch::Tensor control;
  c10::intrusive_ptr<c10d::Work> control_work;
  bool decoded = false;
  MessageLayout layout;
  bool spec_posted = false;
  std::vector<int64_t> spec_caps;
  std::vector<torch::Tensor> spec;  // byte buffers
  std::vector<c10::intrusive_ptr<c10d::Work>> spec_works;
  std::vector<torch::Tensor> data;  // byte buffers, one per tensor, once decoded
  std::vector<c10::intrusive_ptr<c10d::Work>> data_works;
  std::vector<torch::Tensor> retired;  // speculative buffers completed by placeholders
  std::vector<c10::intrusive_ptr<c10d::Work>> retired_works;
  std::optional<Batch> result;
  std::exception_ptr error;
};

class RecvStream {
 public:
  using TagFn = std::function<int(size_t slot)>;
  RecvStream(ProcessGroupPtr pg, int rank, int src, uint32_t code, TagFn tag,
             const CommOptions& options, std::shared_ptr<FaultState> faults,
             std::function<void(std::exception_ptr)> on_error);
  ~RecvStream();

  // Posts the receive of the next message (engine thread).
  std::shared_ptr<PendingRecv> post(const std::string& what, const OpDesc& op);
  // Waits for message p (engine thread); `op` names it in errors.
  Batch wait(const std::shared_ptr<PendingRecv>& p, Clock::time_point deadline, const OpDesc& op);
  // Whether message p has arrived (its header; the data follows right behind); never blocks.
  bool ready(const PendingRecv& p);
  // Stops the progress thread. Returns false when receives are still posted in Gloo, whose
  // buffers must then outlive the process group.
  bool close();

 private:
  void run();
  void decode(PendingRecv& p);  // under mu_
  void post_spec(PendingRecv& p);
  c10::intrusive_ptr<c10d::Work> post_bytes(torch::Tensor& buffer, int64_t bytes, size_t slot);

  ProcessGroupPtr pg_;
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
  std::vector<int64_t> caps_;  // high-water bytes per slot over the decoded messages
  std::map<uint64_t, std::shared_ptr<PendingRecv>> pending_;
  std::exception_ptr error_;
  c10::intrusive_ptr<c10d::Work> current_;  // the control the thread waits on
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pipetrain::comm::detail
