// Collectives over a c10d process group (Gloo, or NCCL on GPUs).
#include "c10d_group.h"

#include "pipetrain/error.h"
#include "work_wait.h"

namespace pipetrain::comm::detail {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

// Gloo reduces these dtypes (no bool, no bfloat16 in LibTorch 1.13).
bool gloo_reduces(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::Half:
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
      return true;
    default:
      return false;
  }
}

std::string bytes_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// NCCL moves device memory only: a host tensor (a loss, a metric) travels through the rank's
// GPU and is copied back.
torch::Tensor wire_tensor(const torch::Tensor& flat, const CommOptions& options) {
  return options.backend() == Backend::Nccl && !flat.is_cuda() ? flat.to(options.device()) : flat;
}

void copy_back(torch::Tensor& flat, const torch::Tensor& wire) {
  if (!wire.is_same(flat)) flat.copy_(wire);
}

}  // namespace

C10dGroup::C10dGroup(ProcessGroupPtr pg, GroupSpec spec, int global_rank,
                     CommOptions options, std::shared_ptr<FaultState> faults)
    : pg_(std::move(pg)),
      spec_(std::move(spec)),
      global_rank_(global_rank),
      options_(std::move(options)),
      faults_(std::move(faults)) {}

C10dGroup::~C10dGroup() {
  // After a failure a Gloo worker may still block on a lost peer until its own timeout, and
  // destroying the process group would join it: let the process exit without waiting.
  if (failed_ || faults_->fault()) (void)pg_.release();
}

OpDesc C10dGroup::describe(const std::string& what, const std::string& detail) const {
  OpDesc op;
  op.namer = &options_.rank_namer();
  op.self = global_rank_;
  op.action = what + " (" + detail + ") over " + describe_group(*this);
  op.timeout = options_.timeout();
  op.members = spec_.ranks;
  op.device_side = options_.backend() == Backend::Nccl;
  return op;
}

template <typename Start>
void C10dGroup::run(const std::string& what, const std::string& detail, Start&& start) {
  const OpDesc op = describe(what, detail);
  const auto deadline = Clock::now() + options_.timeout();
  try {
    check_no_fault(*faults_, op);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = start();
    } catch (const c10::Error& e) {
      throw_failure(*faults_, op, e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw_failure(*faults_, op, e.what());
    }
    wait_collective(work, deadline, *faults_, op);
  } catch (const CommError&) {
    failed_ = true;
    throw;
  }
}

void C10dGroup::all_reduce_flat(torch::Tensor& flat, ReduceOp op, const std::string& what) {
  if (options_.backend() == Backend::Gloo && !gloo_reduces(flat.scalar_type())) {
    throw BatchError(what + " over " + describe_group(*this) + ": Gloo cannot reduce dtype " +
                     c10::toString(flat.scalar_type()) + "; convert to float, double or an integer type");
  }
  const std::string detail = to_string(op) + " of " +
                             bytes_text(flat.numel() * static_cast<int64_t>(flat.element_size()));
  torch::Tensor wire = wire_tensor(flat, options_);
  run(what, detail, [&] {
    std::vector<at::Tensor> tensors{wire};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = options_.timeout();
    return pg_->allreduce(tensors, opts);
  });
  copy_back(flat, wire);
}

void C10dGroup::broadcast_flat(torch::Tensor& flat, int root_index, const std::string& what) {
  const std::string detail = "from " + options_.rank_namer()(spec_.ranks.at(static_cast<size_t>(root_index))) +
                             ", " + bytes_text(flat.numel() * static_cast<int64_t>(flat.element_size()));
  torch::Tensor wire = wire_tensor(flat, options_);
  run(what, detail, [&] {
    std::vector<at::Tensor> tensors{wire};
    c10d::BroadcastOptions opts;
    opts.rootRank = root_index;
    opts.timeout = options_.timeout();
    return pg_->broadcast(tensors, opts);
  });
  copy_back(flat, wire);
}

void C10dGroup::all_gather_flat(const torch::Tensor& flat, torch::Tensor& out, const std::string& what) {
  const int64_t bytes = flat.numel() * static_cast<int64_t>(flat.element_size());
  const std::string detail = bytes_text(bytes) + " from each member";
  // Nothing is reduced, so any dtype travels as its bytes (Gloo in LibTorch 1.13 gathers no
  // bfloat16).
  const bool as_bytes = options_.backend() == Backend::Gloo && !gloo_reduces(flat.scalar_type());
  torch::Tensor input = wire_tensor(as_bytes ? flat.view(torch::kUInt8) : flat, options_);
  torch::Tensor gathered = wire_tensor(as_bytes ? out.view({size(), -1}).view(torch::kUInt8) : out, options_);
  std::vector<at::Tensor> outputs;
  for (int i = 0; i < size(); ++i) outputs.push_back(gathered.select(0, i));
  run(what, "all-gather of " + detail, [&] {
    std::vector<std::vector<at::Tensor>> out_lists{outputs};
    std::vector<at::Tensor> in_list{input};
    c10d::AllgatherOptions opts;
    opts.timeout = options_.timeout();
    return pg_->allgather(out_lists, in_list, opts);
  });
  if (gathered.device() != out.device()) out.copy_(gathered.view_as(out));
}

void C10dGroup::barrier(const std::string& what) {
  run(what, "barrier", [&] {
    c10d::BarrierOptions opts;
    opts.timeout = options_.timeout();
    // NCCL's barrier is an all-reduce on a device: name the rank's own, or c10d guesses one
    // from the rank number (the wrong GPU, a hang, where ranks do not map to GPUs 0..n-1).
    const auto device = options_.device();
    if (options_.backend() == Backend::Nccl && device.is_cuda() && device.has_index()) {
      opts.device_ids.push_back(device.index());
    }
    return pg_->barrier(opts);
  });
}

}  // namespace pipetrain::comm::detail
