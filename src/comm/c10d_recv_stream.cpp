// The receiving end of one stream over Gloo, with a header-decoding progress thread.
#include "c10d_recv_stream.h"

#include "pipetrain/error.h"

namespace pipetrain::comm::detail {
namespace {

// Control messages may be posted long before their sender gets to them (the next step's
// activations); the progress thread waits that long. Engine waits have their own deadline.
constexpr auto kIdleWait = std::chrono::hours(24 * 365);

}  // namespace

RecvStream::RecvStream(ProcessGroupPtr pg, int rank, int src, uint32_t code, TagFn tag,
                       const CommOptions& options, std::shared_ptr<FaultState> faults,
                       std::function<void(std::exception_ptr)> on_error)
    : pg_(std::move(pg)),
      rank_(rank),
      src_(src),
      code_(code),
      tag_(std::move(tag)),
      options_(options),
      faults_(std::move(faults)),
      on_error_(std::move(on_error)) {
  thread_ = std::thread([this] { run(); });
}

RecvStream::~RecvStream() { close(); }

bool RecvStream::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (current_) {
      try {
        current_->abort();
      } catch (...) {
      }
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.empty();
}

c10::intrusive_ptr<c10d::Work> RecvStream::post_bytes(torch::Tensor& buffer, int64_t bytes, size_t slot) {
  buffer = torch::empty({bytes}, torch::kUInt8);
  std::vector<at::Tensor> one{buffer};
  return pg_->recv(one, src_, tag_(slot));
}

void RecvStream::post_spec(PendingRecv& p) {
  const size_t k = last_layout_->tensors.size();
  p.spec_caps.assign(caps_.begin(), caps_.begin() + static_cast<std::ptrdiff_t>(k));
  p.spec.resize(k);
  p.spec_works.resize(k);
  for (size_t i = 0; i < k; ++i) p.spec_works[i] = post_bytes(p.spec[i], p.spec_caps[i], i + 1);
  p.spec_posted = true;
}

std::shared_ptr<PendingRecv> RecvStream::post(const std::string& what, const OpDesc& op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
  auto p = std::make_shared<PendingRecv>();
  p->seq = next_request_;
  p->what = what;
  p->control = torch::empty({static_cast<int64_t>(kMaxControlBytes)}, torch::kUInt8);
  try {
    std::vector<at::Tensor> one{p->control};
    p->control_work = pg_->recv(one, src_, tag_(0));
    // Message n's data receives are posted as soon as message n-1's layout is known.
    if (p->seq > 0 && decoded_ == p->seq) post_spec(*p);
  } catch (const std::exception& e) {
    throw_failure(*faults_, op, e.what());
  }
  next_request_++;
  pending_[p->seq] = p;
  cv_.notify_all();
  return p;
}

void RecvStream::decode(PendingRecv& p) {
  const RankNamer& name = options_.rank_namer();
  const std::string where = name(rank_) + ": recv " + p.what + " from " + name(src_);
  ControlMessage control;
  try {
    control = decode_control(p.control.data_ptr<uint8_t>(), static_cast<size_t>(p.control.numel()));
  } catch (const CommError& e) {
    throw CommError(where + ": " + e.what());
  }
  if (control.seq != p.seq || control.stream_code != code_) {
    throw CommError(where + ": expected message " + std::to_string(p.seq) + " of stream " +
                    std::to_string(code_) + ", got message " + std::to_string(control.seq) + " of stream " +
                    std::to_string(control.stream_code) +
                    "; the ranks run different schedules or pipetrain versions");
  }
  if (!control.layout && !last_layout_) {
    throw CommError(where + ": malformed message header: the first message of a stream carries no layout");
  }
  const MessageLayout layout = control.layout ? *control.layout : *last_layout_;
  const size_t k = layout.tensors.size();
  p.data.assign(k, torch::Tensor());
  p.data_works.assign(k, c10::intrusive_ptr<c10d::Work>());
  for (size_t i = 0; i < p.spec.size(); ++i) {
    if (fits_speculative(layout, p.spec_caps, i)) {
      p.data[i] = p.spec[i];
      p.data_works[i] = p.spec_works[i];
    } else {  // the sender completed it with a placeholder
      p.retired.push_back(p.spec[i]);
      p.retired_works.push_back(p.spec_works[i]);
    }
  }
  p.spec.clear();
  p.spec_works.clear();
  // None (an optional skip's undefined tensor) has no data: a speculative slot took the
  // sender's placeholder above; otherwise nothing is posted for it.
  for (size_t i = 0; i < k; ++i) {
    if (!p.data_works[i] && !layout.tensors[i].none) {
      p.data_works[i] = post_bytes(p.data[i], layout.tensors[i].nbytes(), i + 1);
    }
  }
  p.layout = layout;
  p.decoded = true;
  p.control = torch::Tensor();
  p.control_work.reset();
  last_layout_ = layout;
  grow_caps(caps_, layout);
  decoded_++;
  auto next = pending_.find(decoded_);
  if (next != pending_.end() && !next->second->spec_posted) post_spec(*next->second);
}

void RecvStream::run() {
  OpDesc op;
  op.namer = &options_.rank_namer();
  op.self = rank_;
  op.peer = src_;
  op.timeout = options_.timeout();
  for (;;) {
    c10::intrusive_ptr<c10d::Work> work;
    std::shared_ptr<PendingRecv> p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || pending_.count(decoded_) > 0; });
      if (stop_) return;
      p = pending_.at(decoded_);
      work = p->control_work;
      current_ = work;
    }
    op.action = "recv " + p->what + " from " + options_.rank_namer()(src_);
    std::exception_ptr error;
    try {
      auto guard = faults_->on_fault([work] {
        try {
          work->abort();
        } catch (...) {
        }
      });
      bool completed = false;
      try {
        completed = work->wait(std::chrono::duration_cast<std::chrono::milliseconds>(kIdleWait));
      } catch (...) {
        throw_failure(*faults_, op, what_of(std::current_exception()));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        current_.reset();
        if (stop_) return;
      }
      if (!completed) throw_fault(*faults_, op);  // aborted by a fault
      std::lock_guard<std::mutex> lock(mu_);
      decode(*p);
    } catch (...) {
      error = std::current_exception();
    }
    if (error) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = error;
        current_.reset();
      }
      on_error_(error);
      cv_.notify_all();
      return;
    }
    cv_.notify_all();
  }
}

bool RecvStream::ready(const PendingRecv& p) {
  // Gloo's receive work says it is complete only once waited on, so the header stands for the
  // message: the sender posts the data right behind it.
  std::lock_guard<std::mutex> lock(mu_);
  return p.result.has_value() || (p.decoded && !p.error);
}

Batch RecvStream::wait(const std::shared_ptr<PendingRecv>& p, Clock::time_point deadline, const OpDesc& op) {
  if (p->result) return *p->result;
  if (p->error) std::rethrow_exception(p->error);
  try {
    {
      // Faults wake this wait too (the progress thread may be blocked elsewhere).
      auto guard = faults_->on_fault([this] {
        std::lock_guard<std::mutex> lock(mu_);
        cv_.notify_all();
      });
      std::unique_lock<std::mutex> lock(mu_);
      const bool ready = cv_.wait_until(lock, deadline, [&] {
        return p->decoded || error_ != nullptr || faults_->fault().has_value();
      });
      if (!p->decoded) {
        if (error_) std::rethrow_exception(error_);
        lock.unlock();
        if (faults_->fault()) throw_fault(*faults_, op);
        (void)ready;
        throw_timeout(*faults_, op);
      }
    }
    // Only this thread waits on data buffers (Gloo allows one waiter per buffer).
    for (auto& w : p->data_works) {
      if (w) wait_p2p(w, deadline, *faults_, op);  // none-only slots have no receive
    }
    for (auto& w : p->retired_works) wait_p2p(w, deadline, *faults_, op);
    std::vector<torch::Tensor> values;
    {
      std::lock_guard<std::mutex> lock(mu_);
      p->retired.clear();
      p->retired_works.clear();
      p->data_works.clear();
      values = std::move(p->data);
      pending_.erase(p->seq);
    }
    for (size_t i = 0; i < values.size(); ++i) {
      // A fresh tensor (not a view) over the first nbytes of the byte buffer, which it keeps alive.
      const TensorLayout& t = p->layout.tensors[i];
      if (t.none) {  // no data; the value is an undefined tensor
        values[i] = torch::Tensor();
        continue;
      }
      torch::Tensor bytes = values[i];
      values[i] = torch::from_blob(
          bytes.data_ptr(), t.sizes, [bytes](void*) mutable { bytes.reset(); },
          torch::TensorOptions().dtype(t.dtype));
      if (!options_.device().is_cpu()) values[i] = values[i].to(options_.device());
      if (t.requires_grad && values[i].is_floating_point()) values[i].requires_grad_(true);
    }
    // The decoder allows none only in tuples.
    p->result = p->layout.atomic ? Batch(values.front()) : Batch::tuple_with_none(std::move(values));
    return *p->result;
  } catch (const Error&) {
    p->error = std::current_exception();
    on_error_(p->error);
    throw;
  }
}

}  // namespace pipetrain::comm::detail
