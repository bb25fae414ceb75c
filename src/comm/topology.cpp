// The process grid: rank <-> (stage, replica, tensor), pipe outermost, tensor innermost.
#include "pipetrain/comm/topology.h"

#include <algorithm>
#include <set>

#include "pipetrain/error.h"

namespace pipetrain::comm {

bool GroupSpec::contains(int rank) const {
  return std::binary_search(ranks.begin(), ranks.end(), rank);
}

Topology::Topology(int stages, int replicas, int tensor) : stages_(stages), replicas_(replicas), tensor_(tensor) {
  if (stages < 1) {
    throw ConfigError("number of pipeline stages is " + std::to_string(stages) +
                      "; it must be >= 1");
  }
  if (replicas < 1) {
    throw ConfigError("number of data-parallel replicas is " + std::to_string(replicas) +
                      "; it must be >= 1");
  }
  if (tensor < 1) {
    throw ConfigError("tensor-parallel size is " + std::to_string(tensor) + "; it must be >= 1");
  }
}

Topology Topology::for_world(int world_size, int stages, int replicas, int tensor) {
  if (stages < 1) {
    throw ConfigError("number of pipeline stages is " + std::to_string(stages) +
                      "; it must be >= 1");
  }
  if (tensor < 1) {
    throw ConfigError("tensor-parallel size is " + std::to_string(tensor) + "; it must be >= 1");
  }
  const int per_replica = stages * tensor;
  const std::string shape = std::to_string(stages) + " stages" +
                            (tensor > 1 ? " x " + std::to_string(tensor) + " tensor-parallel" : "");
  if (replicas == 0) {
    if (world_size % per_replica != 0) {
      throw ConfigError("world size " + std::to_string(world_size) + " is not a multiple of the " + shape + " = " +
                        std::to_string(per_replica) + " ranks of a replica; launch a multiple of " +
                        std::to_string(per_replica) + " processes (e.g. " + std::to_string(per_replica) + " or " +
                        std::to_string(2 * per_replica) + ")");
    }
    replicas = world_size / per_replica;
  }
  if (world_size != per_replica * replicas) {
    throw ConfigError("world size " + std::to_string(world_size) + " != " + shape + " x " +
                      std::to_string(replicas) + " replicas = " + std::to_string(per_replica * replicas) +
                      "; launch " + std::to_string(per_replica * replicas) +
                      " processes (pipetrain launch --nproc " + std::to_string(per_replica * replicas) +
                      " ...) or change the number of stages" +
                      (tensor > 1 ? std::string(", replicas or the tensor-parallel size") : std::string(" or replicas")));
  }
  return Topology(stages, replicas, tensor);
}

Coord Topology::coord_of(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw ConfigError("rank " + std::to_string(rank) + " is outside the grid of " + describe() +
                      " (ranks 0.." + std::to_string(world_size() - 1) + ")");
  }
  const int cell = rank / tensor_;
  return {cell / replicas_, cell % replicas_, rank % tensor_};
}

int Topology::rank_of(int stage, int replica, int tensor) const {
  if (stage < 0 || stage >= stages_ || replica < 0 || replica >= replicas_ || tensor < 0 || tensor >= tensor_) {
    throw ConfigError("(stage " + std::to_string(stage) + ", replica " + std::to_string(replica) +
                      (tensor_ > 1 || tensor != 0 ? ", tensor " + std::to_string(tensor) : std::string()) +
                      ") is outside the grid of " + describe());
  }
  return (stage * replicas_ + replica) * tensor_ + tensor;
}

std::optional<int> Topology::prev_rank(int rank) const {
  const Coord c = coord_of(rank);
  if (c.stage == 0) return std::nullopt;
  return rank_of(c.stage - 1, c.replica, c.tensor);
}

std::optional<int> Topology::next_rank(int rank) const {
  const Coord c = coord_of(rank);
  if (c.stage == stages_ - 1) return std::nullopt;
  return rank_of(c.stage + 1, c.replica, c.tensor);
}

int Topology::pipe_neighbor(int rank, int offset) const {
  const Coord c = coord_of(rank);
  const int stage = ((c.stage + offset) % stages_ + stages_) % stages_;
  return rank_of(stage, c.replica, c.tensor);
}

std::vector<int> Topology::data_parallel_ranks(int stage, int tensor) const {
  std::vector<int> ranks;
  for (int d = 0; d < replicas_; ++d) ranks.push_back(rank_of(stage, d, tensor));
  return ranks;
}

std::vector<int> Topology::pipeline_ranks(int replica, int tensor) const {
  std::vector<int> ranks;
  for (int s = 0; s < stages_; ++s) ranks.push_back(rank_of(s, replica, tensor));
  return ranks;
}

std::vector<int> Topology::tensor_parallel_ranks(int stage, int replica) const {
  std::vector<int> ranks;
  for (int t = 0; t < tensor_; ++t) ranks.push_back(rank_of(stage, replica, t));
  return ranks;
}

std::vector<int> Topology::tied_ranks(const std::vector<int>& stages, int replica, int tensor) const {
  std::set<int> ranks;
  for (int s : stages) ranks.insert(rank_of(s, replica, tensor));
  return {ranks.begin(), ranks.end()};
}

std::vector<GroupSpec> Topology::groups(const std::vector<TiedKey>& tied) const {
  std::vector<GroupSpec> specs;
  for (int s = 0; s < stages_; ++s) {
    for (int t = 0; t < tensor_; ++t) specs.push_back({data_parallel_group_name(s, t), data_parallel_ranks(s, t)});
  }
  for (int d = 0; d < replicas_; ++d) {
    for (int t = 0; t < tensor_; ++t) specs.push_back({pipeline_group_name(d, t), pipeline_ranks(d, t)});
  }
  if (tensor_ > 1) {
    for (int s = 0; s < stages_; ++s) {
      for (int d = 0; d < replicas_; ++d) {
        specs.push_back({tensor_parallel_group_name(s, d), tensor_parallel_ranks(s, d)});
      }
    }
  }
  std::set<std::string> seen;
  for (const TiedKey& t : tied) {
    if (t.key.empty()) throw ConfigError("a tied-weight key is empty; name every tied module");
    if (!seen.insert(t.key).second) {
      throw ConfigError("tied-weight key '" + t.key + "' is listed twice; merge its stages");
    }
    if (t.stages.empty()) {
      throw ConfigError("tied-weight key '" + t.key + "' has no stages");
    }
    for (int s : t.stages) {
      if (s < 0 || s >= stages_) {
        throw ConfigError("tied-weight key '" + t.key + "' names stage " + std::to_string(s) +
                          " but the pipe has stages 0.." + std::to_string(stages_ - 1));
      }
    }
    for (int d = 0; d < replicas_; ++d) {
      for (int k = 0; k < tensor_; ++k) specs.push_back({tied_group_name(t.key, d, k), tied_ranks(t.stages, d, k)});
    }
  }
  return specs;
}

std::string Topology::describe_rank(int rank) const {
  const Coord c = coord_of(rank);
  std::string text = "stage " + std::to_string(c.stage);
  if (replicas_ > 1) text += ", replica " + std::to_string(c.replica);
  if (tensor_ > 1) text += ", tensor " + std::to_string(c.tensor);
  return text + " (rank " + std::to_string(rank) + ")";
}

std::string Topology::describe() const {
  return std::to_string(stages_) + " stage" + (stages_ == 1 ? "" : "s") + " x " +
         std::to_string(replicas_) + " replica" + (replicas_ == 1 ? "" : "s") +
         (tensor_ > 1 ? " x " + std::to_string(tensor_) + " tensor-parallel" : "");
}

namespace {
std::string tensor_suffix(int tensor) { return tensor == 0 ? "" : "/tp" + std::to_string(tensor); }
}  // namespace

std::string data_parallel_group_name(int stage, int tensor) {
  return "dp/stage" + std::to_string(stage) + tensor_suffix(tensor);
}
std::string pipeline_group_name(int replica, int tensor) {
  return "pipe/replica" + std::to_string(replica) + tensor_suffix(tensor);
}
std::string tensor_parallel_group_name(int stage, int replica) {
  return "tp/stage" + std::to_string(stage) + "/replica" + std::to_string(replica);
}
std::string tied_group_name(const std::string& key, int replica, int tensor) {
  return "tied/" + key + "/replica" + std::to_string(replica) + tensor_suffix(tensor);
}

}  // namespace pipetrain::comm
