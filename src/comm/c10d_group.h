// Collectives of a group over a c10d ProcessGroupGloo, with deadlines and fault interruption.
#pragma once

#include <memory>

#include "c10d_compat.h"

#include "fault_state.h"
#include "work_wait.h"
#include "pipetrain/comm/group.h"
#include "pipetrain/comm/options.h"
#include "pipetrain/comm/topology.h"

namespace pipetrain::comm::detail {

class C10dGroup final : public Group {
 public:
  C10dGroup(ProcessGroupPtr pg, GroupSpec spec, int global_rank,
            CommOptions options, std::shared_ptr<FaultState> faults);
  ~C10dGroup() override;

  const std::string& name() const override { return spec_.name; }
  const std::vector<int>& ranks() const override { return spec_.ranks; }
  void barrier(const std::string& what) override;

 protected:
  int64_t bucket_bytes() const override { return options_.bucket_bytes(); }
  void all_reduce_flat(torch::Tensor& flat, ReduceOp op, const std::string& what) override;
  void broadcast_flat(torch::Tensor& flat, int root_index, const std::string& what) override;
  void all_gather_flat(const torch::Tensor& flat, torch::Tensor& out, const std::string& what) override;

 private:
  OpDesc describe(const std::string& what, const std::string& detail) const;
  template <typename Start>
  void run(const std::string& what, const std::string& detail, Start&& start);

  ProcessGroupPtr pg_;
  GroupSpec spec_;
  int global_rank_;
  CommOptions options_;
  std::shared_ptr<FaultState> faults_;
  bool failed_ = false;
};

// A group of this rank alone: every collective is the identity.
class SoloGroup final : public Group {
 public:
  SoloGroup(GroupSpec spec, int64_t bucket_bytes) : spec_(std::move(spec)), bucket_bytes_(bucket_bytes) {}
  const std::string& name() const override { return spec_.name; }
  const std::vector<int>& ranks() const override { return spec_.ranks; }
  void barrier(const std::string&) override {}

 protected:
  int64_t bucket_bytes() const override { return bucket_bytes_; }
  void all_reduce_flat(torch::Tensor&, ReduceOp, const std::string&) override {}
  void broadcast_flat(torch::Tensor&, int, const std::string&) override {}
  void all_gather_flat(const torch::Tensor& flat, torch::Tensor& out, const std::string&) override {
    out.select(0, 0).copy_(flat);
  }

 private:
  GroupSpec spec_;
  int64_t bucket_bytes_;
};

}  // namespace pipetrain::comm::detail
