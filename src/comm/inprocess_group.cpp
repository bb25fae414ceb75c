// Collectives between threads of one process: rounds in which every member contributes.
#include "hub_state.h"
#include "pipetrain/error.h"

namespace pipetrain::comm::detail {
namespace {

class InProcessGroup final : public Group {
 public:
  InProcessGroup(std::shared_ptr<HubState> hub, int rank, GroupSpec spec, std::shared_ptr<GroupRounds> rounds)
      : hub_(std::move(hub)), rank_(rank), spec_(std::move(spec)), rounds_(std::move(rounds)) {}

  const std::string& name() const override { return spec_.name; }
  const std::vector<int>& ranks() const override { return spec_.ranks; }
  void barrier(const std::string& what) override {
    torch::Tensor none;
    round(what, "barrier", none, [](GroupRounds&, const torch::Tensor&, bool) {});
  }

 protected:
  int64_t bucket_bytes() const override { return hub_->options.bucket_bytes(); }

  void all_reduce_flat(torch::Tensor& flat, ReduceOp op, const std::string& what) override {
    const std::string sig = "all-reduce " + to_string(op) + " of " + std::to_string(flat.numel()) + " " +
                            c10::toString(flat.scalar_type());
    round(what, sig, flat, [op](GroupRounds& g, const torch::Tensor& mine, bool first) {
      if (first) {
        g.acc = mine.clone();
      } else if (op == ReduceOp::Max) {
        g.acc = torch::max(g.acc, mine);
      } else if (op == ReduceOp::Min) {
        g.acc = torch::min(g.acc, mine);
      } else {
        g.acc.add_(mine);
      }
    });
  }

  void all_gather_flat(const torch::Tensor& flat, torch::Tensor& out, const std::string& what) override {
    const std::string sig = "all-gather of " + std::to_string(flat.numel()) + " " + c10::toString(flat.scalar_type());
    const int64_t index = index_of(rank_);
    round(what, sig, out, [&](GroupRounds& g, const torch::Tensor&, bool first) {
      if (first) g.acc = torch::empty_like(out);
      g.acc.select(0, index).copy_(flat);
    });
  }

  void broadcast_flat(torch::Tensor& flat, int root_index, const std::string& what) override {
    const bool root = spec_.ranks[static_cast<size_t>(root_index)] == rank_;
    const std::string sig = "broadcast from " + std::to_string(root_index) + " of " +
                            std::to_string(flat.numel()) + " " + c10::toString(flat.scalar_type());
    round(what, sig, flat, [root](GroupRounds& g, const torch::Tensor& mine, bool) {
      if (root) g.acc = mine.clone();
    });
  }

 private:
  template <typename Contribute>
  void round(const std::string& what, const std::string& sig, torch::Tensor& flat, Contribute&& contribute) {
    const auto deadline = Clock::now() + hub_->options.timeout();
    GroupRounds& g = *rounds_;
    auto describe = [&] {
      OpDesc op;
      op.namer = &hub_->options.rank_namer();
      op.self = rank_;
      std::string missing;
      for (int r : g.ranks) {
        if (!g.arrived_ranks.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      op.action = what + " (" + sig + ") over " + describe_group(*this) +
                  (g.complete || missing.empty() ? "" : ", waiting for ranks " + missing);
      op.timeout = hub_->options.timeout();
      return op;
    };
    {
      std::unique_lock<std::mutex> lock(hub_->mu);
      const uint64_t mine = g.next_round[rank_]++;
      hub_->wait(lock, deadline, [&] { return g.round == mine; }, describe);
      if (g.arrived == 0) {
        g.signature = sig;
      } else if (g.signature != sig) {
        const std::string message = hub_->options.rank_namer()(rank_) + ": " + what + " called " + sig +
                                    " over " + describe_group(*this) + " while other members called " +
                                    g.signature + "; every member must make the same collective calls";
        lock.unlock();
        hub_->faults->raise({rank_, FaultKind::Failed, message});
        hub_->cv.notify_all();
        throw CommError(message);
      }
      contribute(g, flat, g.arrived == 0);
      g.arrived++;
      g.arrived_ranks.insert(rank_);
      if (g.arrived == static_cast<int>(g.ranks.size())) {
        g.complete = true;
        hub_->cv.notify_all();
      }
      hub_->wait(lock, deadline, [&] { return g.complete; }, describe);
      if (flat.defined() && g.acc.defined()) flat.copy_(g.acc);
      if (++g.left == static_cast<int>(g.ranks.size())) {
        g.round++;
        g.arrived = g.left = 0;
        g.complete = false;
        g.acc = torch::Tensor();
        g.arrived_ranks.clear();
        hub_->cv.notify_all();
      }
    }
  }

  std::shared_ptr<HubState> hub_;
  int rank_;
  GroupSpec spec_;
  std::shared_ptr<GroupRounds> rounds_;
};

}  // namespace

std::shared_ptr<Group> make_inprocess_group(std::shared_ptr<HubState> hub, int rank, const GroupSpec& spec) {
  std::shared_ptr<GroupRounds> rounds;
  {
    std::lock_guard<std::mutex> lock(hub->mu);
    auto& slot = hub->groups[spec.name];
    if (!slot) {
      slot = std::make_shared<GroupRounds>();
      slot->ranks = spec.ranks;
    } else if (slot->ranks != spec.ranks) {
      throw ConfigError("group '" + spec.name + "' was created with other ranks by another member; "
                        "every member must pass the same GroupSpec");
    }
    rounds = slot;
  }
  return std::make_shared<InProcessGroup>(std::move(hub), rank, spec, std::move(rounds));
}

}  // namespace pipetrain::comm::detail
