// connect(): a rank's communicator over a c10d TCPStore and Gloo process groups.
#include <exception>
#include <map>
#include <set>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "c10d_compat.h"
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "c10d_channel.h"
#include "c10d_group.h"
#include "fault_state.h"
#include "peer_monitor.h"
#include "pipetrain/comm/communicator.h"
#include "pipetrain/comm/net.h"
#include "pipetrain/error.h"
#include "pipetrain/util/log.h"
#include "socket_util.h"

namespace pipetrain::comm {
namespace detail {
namespace {

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

c10::intrusive_ptr<c10d::Store> open_store(const RankInfo& info, const CommOptions& options,
                                           const std::string& self) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(info.master_port);
  // Under torchrun's agent every rank is a client of the agent's store. Otherwise rank 0 serves,
  // multi-tenant: torch.distributed's env:// and tcp:// rendezvous serve multi-tenant too, so
  // one server on MASTER_PORT carries both when the script also made a torch.distributed group
  // (in either order); keys stay apart by their prefixes.
  so.isServer = info.rank == 0 && !info.agent_store;
  so.multiTenant = true;
  if (!info.agent_store) so.numWorkers = static_cast<size_t>(info.world_size);
  so.waitWorkers = false;  // the process groups below wait for every rank anyway
  use_plain_socket_store(so);
  // TCPStore's own connection (also rank 0's to itself) retries once a second: give it at
  // least a few tries. Waiting for the other ranks uses connect_timeout explicitly.
  so.timeout = std::max(options.connect_timeout(), std::chrono::milliseconds(5000));
  const std::string where = info.master_addr + ":" + std::to_string(info.master_port);
  if (!so.isServer) {
    // TCPStore's client retries once a second; probing ourselves joins as soon as rank 0
    // listens, which makes every start of a job about a second faster.
    const auto deadline = Clock::now() + options.connect_timeout();
    Fd probe = connect_until(info.master_addr, info.master_port, deadline);
    if (!probe) {
      throw TimeoutError(self + ": " + (info.agent_store ? "torchrun's agent" : "rank 0") +
                         " did not open the rendezvous store at " + where + " within " +
                         format_duration(options.connect_timeout()) + "; start " +
                         (info.agent_store ? "the job with torchrun (TORCHELASTIC_USE_AGENT_STORE=True)"
                                           : "rank 0") +
                         ", and check MASTER_ADDR and MASTER_PORT (" + to_string(info.launcher) + ")");
    }
  }
  try {
    return c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
  } catch (const std::exception& e) {
    const std::string text = what_of(e);
    if (info.rank == 0 && text.find("ddress already in use") != std::string::npos) {
      throw ConfigError(self + ": MASTER_PORT " + std::to_string(info.master_port) +
                        " is already in use on this host; choose a free port (pipetrain launch "
                        "picks one when --master-port is not given) [" + text + "]");
    }
    throw CommError(self + ": cannot open the rendezvous store at " + where + ": " + text);
  }
}

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(const RankInfo& info, CommOptions options)
      : info_(info), options_(std::move(options)), faults_(std::make_shared<FaultState>()) {
    options_.validate();
    const std::string self = options_.rank_namer()(info.rank);
    const std::string bind =
        options_.bind_address().empty() ? local_address_towards(info.master_addr) : options_.bind_address();
    // A restarted torchrun attempt must not read the keys of the one before (the agent's store
    // outlives the workers).
    const std::string prefix =
        info.agent_store ? "pipetrain/attempt_" + std::to_string(info.restart_count) + "/" : "pipetrain/";
    store_ = c10::make_intrusive<c10d::PrefixStore>(prefix, open_store(info, options_, self));
    if (info.world_size > 1) {
      monitor_ = std::make_unique<PeerMonitor>(*store_, info.rank, info.world_size, bind, options_, faults_);
    }
    try {
      p2p_device_ = c10d::ProcessGroupGloo::createDeviceForHostname(bind);
      collective_device_ = c10d::ProcessGroupGloo::createDeviceForHostname(bind);
    } catch (const std::exception& e) {
      throw ConfigError(self + ": cannot bind Gloo to '" + bind + "': " + what_of(e) +
                        "; set CommOptions::bind_address to an address of this host");
    }
    std::vector<int> all(static_cast<size_t>(info.world_size));
    for (int r = 0; r < info.world_size; ++r) all[static_cast<size_t>(r)] = r;
    if (info.world_size > 1) {
      auto up = make_pg("p2p", all, info.rank, p2p_device_);
      auto down = make_pg("p2p-down", all, info.rank, p2p_device_);
      channel_ = std::make_shared<C10dChannel>(up, down, info.rank, info.world_size, options_, faults_);
    } else {
      channel_ = std::make_shared<C10dChannel>(ProcessGroupPtr(), ProcessGroupPtr(), 0, 1, options_, faults_);
    }
    world_ = new_group({"world", all});
    util::set_log_rank(info.rank);
  }

  ~C10dCommunicator() override {
    const bool failing = faults_->fault().has_value() || std::uncaught_exceptions() > 0;
    if (monitor_ && !shut_down_) {
      if (failing && !failure_reported_) {
        // Pass the root cause on, so that peers name the rank that was lost first.
        const auto lost = faults_->fault();
        monitor_->send_failure(lost ? "it lost " + lost->describe(options_.rank_namer())
                                    : "it stopped with an error (see its log)");
      } else if (!failing) {
        monitor_->send_goodbye();
      }
    }
    if (channel_) channel_->close();
    channel_.reset();
    world_.reset();
    monitor_.reset();
    if (failing) (void)store_.release();  // its server thread may serve ranks still failing
  }

  int rank() const override { return info_.rank; }
  int world_size() const override { return info_.world_size; }
  int local_rank() const override { return info_.local_rank; }
  const CommOptions& options() const override { return options_; }
  Channel& channel() override { return *channel_; }
  Group& world() override { return *world_; }
  std::optional<Fault> fault() const override { return faults_->fault(); }

  std::shared_ptr<Group> new_group(const GroupSpec& spec) override {
    const std::string self = options_.rank_namer()(info_.rank);
    std::set<int> unique(spec.ranks.begin(), spec.ranks.end());
    if (spec.name.empty() || unique.size() != spec.ranks.size() ||
        !std::is_sorted(spec.ranks.begin(), spec.ranks.end()) || spec.ranks.empty() ||
        spec.ranks.front() < 0 || spec.ranks.back() >= info_.world_size) {
      throw ConfigError(self + ": group '" + spec.name + "' [" + join_ranks(spec.ranks) +
                        "] must have a name and distinct ascending ranks below the world size " +
                        std::to_string(info_.world_size));
    }
    if (!spec.contains(info_.rank)) {
      throw ConfigError(self + " is not a member of group '" + spec.name + "' [" +
                        join_ranks(spec.ranks) + "]; only members create a group");
    }
    // A name is taken while its group lives; made again after (a process that trains a second
    // engine), it rendezvouses under a store prefix of its own, which every member counts alike
    // because members create their groups in the same order.
    // The count is kept per name *and* member list: every creation of one (name, members) pair
    // involves exactly those members, so they all count it alike, whereas one name may have had
    // other members before on some ranks only (engine A's 'dp/stage0' was rank 0 alone, engine
    // B's is ranks 0 and 1: counted by name, rank 0 would have rendezvoused under 'dp/stage0#1'
    // and rank 1 under 'dp/stage0', and both timed out).
    std::weak_ptr<Group>& live = live_[spec.name];
    if (!live.expired()) {
      throw ConfigError(self + ": group '" + spec.name + "' was already created; give each group its own name");
    }
    const std::string members = spec.name + "[" + join_ranks(spec.ranks) + "]";
    const int created = created_[members]++;
    auto group = make_group(spec, "group/" + members + "#" + std::to_string(created));
    live = group;
    return group;
  }

  std::shared_ptr<Group> make_group(const GroupSpec& spec, const std::string& prefix) {
    if (spec.ranks.size() == 1) return std::make_shared<SoloGroup>(spec, options_.bucket_bytes());
    const int index = static_cast<int>(std::lower_bound(spec.ranks.begin(), spec.ranks.end(), info_.rank) -
                                       spec.ranks.begin());
    ProcessGroupPtr pg;
#ifdef USE_C10D_NCCL
    if (options_.backend() == Backend::Nccl) {
      auto nccl_opts = c10d::ProcessGroupNCCL::Options::create();
      nccl_opts->timeout = options_.timeout();
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>(prefix + "/", store_), index,
          static_cast<int>(spec.ranks.size()), nccl_opts);
    }
#endif
    if (!pg) pg = make_pg(prefix, spec.ranks, index, collective_device_);
    return std::make_shared<C10dGroup>(pg, spec, info_.rank, options_, faults_);
  }

  void report_failure(const std::string& reason) override {
    failure_reported_ = true;
    if (monitor_) monitor_->send_failure(reason);
  }

  void interrupt(const std::string& reason) override {
    // A fault of this rank itself wakes every wait (the channel's and the groups' aborts).
    faults_->raise(Fault{info_.rank, FaultKind::Failed, reason});
    if (!failure_reported_) report_failure(reason);
  }

  void shutdown() override {
    if (shut_down_) return;
    channel_->wait_sends();
    if (monitor_) monitor_->send_goodbye();
    shut_down_ = true;
  }

 private:
  ProcessGroupPtr make_pg(const std::string& name, const std::vector<int>& ranks,
                                                 int index,
                                                 const std::shared_ptr<::gloo::transport::Device>& device) {
    auto opts = c10d::ProcessGroupGloo::Options::create(options_.timeout());
    opts->devices.push_back(device);
    opts->threads = 1;
    auto store = c10::make_intrusive<c10d::PrefixStore>(name + "/", store_);
    try {
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, index, static_cast<int>(ranks.size()), opts);
    } catch (const std::exception& e) {
      std::vector<int> others;
      for (int r : ranks) {
        if (r != info_.rank) others.push_back(r);
      }
      throw TimeoutError(options_.rank_namer()(info_.rank) + ": creating process group '" + name +
                         "' with ranks [" + join_ranks(others) +
                         "] failed: start every rank and create groups in the same order on all "
                         "of them [" + what_of(e) + "]");
    }
  }

  RankInfo info_;
  CommOptions options_;
  std::shared_ptr<FaultState> faults_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<PeerMonitor> monitor_;
  std::shared_ptr<::gloo::transport::Device> p2p_device_;
  std::shared_ptr<::gloo::transport::Device> collective_device_;
  std::shared_ptr<C10dChannel> channel_;
  std::shared_ptr<Group> world_;
  std::map<std::string, std::weak_ptr<Group>> live_;  // by name: taken while its group lives
  std::map<std::string, int> created_;                 // by name and members: creations so far
  bool shut_down_ = false;
  bool failure_reported_ = false;
};

}  // namespace
}  // namespace detail

std::unique_ptr<Communicator> connect(const RankInfo& info, CommOptions options) {
  return std::make_unique<detail::C10dCommunicator>(info, std::move(options));
}

}  // namespace pipetrain::comm
