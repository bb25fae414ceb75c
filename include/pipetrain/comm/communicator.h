// A rank's connection to the others: its point-to-point channel, the world group, the
// groups it creates, and what it knows about lost peers. Two implementations share this
// interface: connect() (processes over c10d/Gloo) and InProcessHub (threads of one process).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/comm/channel.h"
#include "pipetrain/comm/fault.h"
#include "pipetrain/comm/group.h"
#include "pipetrain/comm/options.h"
#include "pipetrain/comm/rank_info.h"
#include "pipetrain/comm/topology.h"

namespace pipetrain::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // This rank's index among the ranks of its host, as the launcher set it (RankInfo): the
  // device `auto` picks. Ranks that share a process (threads) share its devices: 0.
  virtual int local_rank() const { return 0; }
  virtual const CommOptions& options() const = 0;
  std::string describe_rank(int rank) const { return options().rank_namer()(rank); }

  // Point-to-point transport to any other rank.
  virtual Channel& channel() = 0;
  // Every rank of the job.
  virtual Group& world() = 0;
  // The group of spec.ranks (which must include this rank). Every member calls it with the
  // same spec; ranks create their groups in one global order (Topology::groups gives one),
  // which rules out deadlock. A group of one member needs no communication at all.
  virtual std::shared_ptr<Group> new_group(const GroupSpec& spec) = 0;

  // The first peer fault seen (by any operation or by the liveness monitor), if any. Once
  // set, every later operation raises PeerError naming it.
  virtual std::optional<Fault> fault() const = 0;
  // Tells every peer that this rank is stopping because of `reason`, so their errors name
  // the cause rather than a lost connection. Call it before leaving on an error.
  virtual void report_failure(const std::string& reason) = 0;
  // Stops this rank's communication now because of `reason` (Ctrl-C in the Python front end):
  // every wait of this rank, present or later, fails with PeerError naming it, and the peers are
  // told as by report_failure, so that they stop too instead of waiting for their timeout.
  virtual void interrupt(const std::string& reason) { report_failure(reason); }
  // Clean end: waits for outstanding sends, then says goodbye to the peers. Destroying a
  // communicator without shutdown() (for instance while an exception unwinds) tells the
  // peers it failed.
  virtual void shutdown() = 0;
};

// Connects this process to the others over a c10d TCPStore (served by rank 0 at
// info.master_addr:master_port, shared with a torch.distributed store of the same process on
// that port; served by torchrun's agent when info.agent_store) and Gloo process groups. Blocks until every rank has
// joined, for at most options.connect_timeout (TimeoutError naming the missing ranks).
// ConfigError for a master port already in use or an unusable address.
std::unique_ptr<Communicator> connect(const RankInfo& info, CommOptions options = {});

// The groups one rank of a pipeline x data-parallel grid needs.
struct PipeGroups {
  Coord coord;
  std::optional<int> prev_rank;  // pipe neighbours in this rank's replica
  std::optional<int> next_rank;
  std::shared_ptr<Group> data_parallel;  // this stage across replicas (gradients)
  std::shared_ptr<Group> pipeline;       // every stage of this replica (norms, loss)
  // The ranks sharing this stage's layers by tensor parallelism (itself alone when tensor = 1).
  std::shared_ptr<Group> tensor_parallel;
  // One group per tied key this rank's stage holds: the stages sharing it, this replica.
  std::vector<std::pair<std::string, std::shared_ptr<Group>>> tied;
  std::shared_ptr<Group> tied_group(const std::string& key) const;  // nullptr if not held
};

// Creates the groups of `topology` this rank belongs to, in the canonical order.
// ConfigError when the communicator's world size does not match the topology.
PipeGroups build_pipe_groups(Communicator& comm, const Topology& topology,
                             const std::vector<TiedKey>& tied = {});

}  // namespace pipetrain::comm
