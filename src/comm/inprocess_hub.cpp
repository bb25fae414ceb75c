// InProcessHub: communicators for ranks that are threads of one process.
#include <algorithm>
#include <exception>

#include "hub_state.h"
#include "pipetrain/comm/inprocess.h"
#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace detail {

HubState::HubState(int world, CommOptions opts, bool copy_tensors)
    : world_size(world),
      options(std::move(opts)),
      copy(copy_tensors),
      taken(static_cast<size_t>(world), false),
      devices(static_cast<size_t>(world), options.device()) {}

namespace {

class InProcessEndpoint final : public Communicator {
 public:
  InProcessEndpoint(std::shared_ptr<HubState> hub, int rank)
      : hub_(std::move(hub)), rank_(rank), channel_(make_inprocess_channel(hub_, rank)) {
    std::vector<int> all(static_cast<size_t>(hub_->world_size));
    for (int r = 0; r < hub_->world_size; ++r) all[static_cast<size_t>(r)] = r;
    world_ = make_inprocess_group(hub_, rank, {"world", all});
  }
  ~InProcessEndpoint() override {
    if (std::uncaught_exceptions() > 0 && !failure_reported_) {
      const auto lost = hub_->faults->fault();
      fail(lost ? "it lost " + lost->describe(hub_->options.rank_namer()) : "its thread stopped with an error");
    } else if (!failure_reported_) {
      hub_->faults->raise({rank_, FaultKind::Left, ""});
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size; }
  const CommOptions& options() const override { return hub_->options; }
  Channel& channel() override { return *channel_; }
  Group& world() override { return *world_; }
  std::optional<Fault> fault() const override { return hub_->faults->fault(); }

  std::shared_ptr<Group> new_group(const GroupSpec& spec) override {
    if (spec.name.empty() || spec.ranks.empty() || !std::is_sorted(spec.ranks.begin(), spec.ranks.end()) ||
        std::adjacent_find(spec.ranks.begin(), spec.ranks.end()) != spec.ranks.end() ||
        spec.ranks.front() < 0 || spec.ranks.back() >= hub_->world_size || !spec.contains(rank_)) {
      throw ConfigError(describe_rank(rank_) + ": group '" + spec.name +
                        "' must be named, hold distinct ascending ranks of the world and include this rank");
    }
    return make_inprocess_group(hub_, rank_, spec);
  }

  void report_failure(const std::string& reason) override { fail(reason); }
  void shutdown() override { hub_->faults->raise({rank_, FaultKind::Left, ""}); }

 private:
  void fail(const std::string& reason) {
    failure_reported_ = true;
    hub_->faults->raise({rank_, FaultKind::Failed, reason});
    std::lock_guard<std::mutex> lock(hub_->mu);
    hub_->cv.notify_all();
  }

  std::shared_ptr<HubState> hub_;
  int rank_;
  std::unique_ptr<Channel> channel_;
  std::shared_ptr<Group> world_;
  bool failure_reported_ = false;
};

}  // namespace
}  // namespace detail

std::shared_ptr<InProcessHub> InProcessHub::create(int world_size, CommOptions options, bool copy) {
  if (world_size < 1) {
    throw ConfigError("an in-process hub needs at least one rank, got " + std::to_string(world_size));
  }
  options.validate();
  return std::shared_ptr<InProcessHub>(
      new InProcessHub(std::make_shared<detail::HubState>(world_size, std::move(options), copy)));
}

int InProcessHub::world_size() const { return state_->world_size; }

std::unique_ptr<Communicator> InProcessHub::endpoint(int rank) {
  if (rank < 0 || rank >= state_->world_size) {
    throw ConfigError("rank " + std::to_string(rank) + " is outside the hub of " +
                      std::to_string(state_->world_size) + " ranks");
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->taken[static_cast<size_t>(rank)]) {
      throw UsageError("the endpoint of rank " + std::to_string(rank) + " was already taken; take it once, in its thread");
    }
    state_->taken[static_cast<size_t>(rank)] = true;
  }
  return std::make_unique<detail::InProcessEndpoint>(state_, rank);
}

void InProcessHub::set_device(int rank, torch::Device device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->devices.at(static_cast<size_t>(rank)) = device;
}

void InProcessHub::fail(int rank, const std::string& reason) {
  state_->faults->raise({rank, FaultKind::Failed, reason});
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->cv.notify_all();
}

std::optional<Fault> InProcessHub::fault() const { return state_->faults->fault(); }

}  // namespace pipetrain::comm
