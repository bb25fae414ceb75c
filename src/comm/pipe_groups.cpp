// The process groups of one rank of a pipeline x data-parallel grid.
#include "pipetrain/comm/communicator.h"
#include "pipetrain/error.h"

namespace pipetrain::comm {

std::shared_ptr<Group> PipeGroups::tied_group(const std::string& key) const {
  for (const auto& [k, g] : tied) {
    if (k == key) return g;
  }
  return nullptr;
}

PipeGroups build_pipe_groups(Communicator& comm, const Topology& topology,
                             const std::vector<TiedKey>& tied) {
  if (comm.world_size() != topology.world_size()) {
    throw ConfigError("world size " + std::to_string(comm.world_size()) + " != " +
                      topology.describe() + " = " + std::to_string(topology.world_size()) +
                      " ranks; launch " + std::to_string(topology.world_size()) +
                      " processes or change the number of stages or replicas");
  }
  const int rank = comm.rank();
  PipeGroups out;
  out.coord = topology.coord_of(rank);
  out.prev_rank = topology.prev_rank(rank);
  out.next_rank = topology.next_rank(rank);
  const std::string dp = data_parallel_group_name(out.coord.stage, out.coord.tensor);
  const std::string pipe = pipeline_group_name(out.coord.replica, out.coord.tensor);
  const std::string tp = tensor_parallel_group_name(out.coord.stage, out.coord.replica);
  for (const GroupSpec& spec : topology.groups(tied)) {
    if (!spec.contains(rank)) continue;
    auto group = comm.new_group(spec);
    if (spec.name == dp) {
      out.data_parallel = group;
    } else if (spec.name == pipe) {
      out.pipeline = group;
    } else if (spec.name == tp) {
      out.tensor_parallel = group;
    } else {
      for (const TiedKey& t : tied) {
        if (spec.name == tied_group_name(t.key, out.coord.replica, out.coord.tensor)) out.tied.emplace_back(t.key, group);
      }
    }
  }
  // A group of one needs no communication (Communicator::new_group).
  if (!out.tensor_parallel) out.tensor_parallel = comm.new_group({tp, {rank}});
  return out;
}

}  // namespace pipetrain::comm
