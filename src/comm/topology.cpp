// The process grid: rank <-> (stage, replica), pipe outermost.
#include "pipetrain/comm/topology.h"

#include <algorithm>
#include <set>

#include "pipetrain/error.h"

namespace pipetrain::comm {

bool GroupSpec::contains(int rank) const {
  return std::binary_search(ranks.begin(), ranks.end(), rank);
}

Topology::Topology(int stages, int replicas) : stages_(stages), replicas_(replicas) {
  if (stages < 1) {
    throw ConfigError("number of pipeline stages is " + std::to_string(stages) +
                      "; it must be >= 1");
  }
  if (replicas < 1) {
    throw ConfigError("number of data-parallel replicas is " + std::to_string(replicas) +
                      "; it must be >= 1");
  }
}

Topology Topology::for_world(int world_size, int stages, int replicas) {
  if (stages < 1) {
    throw ConfigError("number of pipeline stages is " + std::to_string(stages) +
                      "; it must be >= 1");
  }
  if (replicas == 0) {
    if (world_size % stages != 0) {
      throw ConfigError("world size " + std::to_string(world_size) +
                        " is not a multiple of the " + std::to_string(stages) +
                        " pipeline stages; launch stages x replicas processes (e.g. " +
                        std::to_string(stages) + " or " + std::to_string(2 * stages) + ")");
    }
    replicas = world_size / stages;
  }
  if (world_size != stages * replicas) {
    throw ConfigError("world size " + std::to_string(world_size) + " != " +
                      std::to_string(stages) + " stages x " + std::to_string(replicas) +
                      " replicas = " + std::to_string(stages * replicas) + "; launch " +
                      std::to_string(stages * replicas) +
                      " processes (pipetrain launch --nproc " + std::to_string(stages * replicas) +
                      " ...) or change the number of stages or replicas");
  }
  return Topology(stages, replicas);
}

Coord Topology::coord_of(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw ConfigError("rank " + std::to_string(rank) + " is outside the grid of " + describe() +
                      " (ranks 0.." + std::to_string(world_size() - 1) + ")");
  }
  return {rank / replicas_, rank % replicas_};
}

int Topology::rank_of(int stage, int replica) const {
  if (stage < 0 || stage >= stages_ || replica < 0 || replica >= replicas_) {
    throw ConfigError("(stage " + std::to_string(stage) + ", replica " + std::to_string(replica) +
                      ") is outside the grid of " + describe());
  }
  return stage * replicas_ + replica;
}

std::optional<int> Topology::prev_rank(int rank) const {
  const Coord c = coord_of(rank);
  if (c.stage == 0) return std::nullopt;
  return rank_of(c.stage - 1, c.replica);
}

std::optional<int> Topology::next_rank(int rank) const {
  const Coord c = coord_of(rank);
  if (c.stage == stages_ - 1) return std::nullopt;
  return rank_of(c.stage + 1, c.replica);
}

int Topology::pipe_neighbor(int rank, int offset) const {
  const Coord c = coord_of(rank);
  const int stage = ((c.stage + offset) % stages_ + stages_) % stages_;
  return rank_of(stage, c.replica);
}

std::vector<int> Topology::data_parallel_ranks(int stage) const {
  std::vector<int> ranks;
  for (int d = 0; d < replicas_; ++d) ranks.push_back(rank_of(stage, d));
  return ranks;
}

std::vector<int> Topology::pipeline_ranks(int replica) const {
  std::vector<int> ranks;
  for (int s = 0; s < stages_; ++s) ranks.push_back(rank_of(s, replica));
  return ranks;
}

std::vector<int> Topology::tied_ranks(const std::vector<int>& stages, int replica) const {
  std::set<int> ranks;
  for (int s : stages) ranks.insert(rank_of(s, replica));
  return {ranks.begin(), ranks.end()};
}

std::vector<GroupSpec> Topology::groups(const std::vector<TiedKey>& tied) const {
  std::vector<GroupSpec> specs;
  for (int s = 0; s < stages_; ++s) specs.push_back({data_parallel_group_name(s), data_parallel_ranks(s)});
  for (int d = 0; d < replicas_; ++d) specs.push_back({pipeline_group_name(d), pipeline_ranks(d)});
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
    for (int d = 0; d < replicas_; ++d) specs.push_back({tied_group_name(t.key, d), tied_ranks(t.stages, d)});
  }
  return specs;
}

std::string Topology::describe_rank(int rank) const {
  const Coord c = coord_of(rank);
  std::string text = "stage " + std::to_string(c.stage);
  if (replicas_ > 1) text += ", replica " + std::to_string(c.replica);
  return text + " (rank " + std::to_string(rank) + ")";
}

std::string Topology::describe() const {
  return std::to_string(stages_) + " stage" + (stages_ == 1 ? "" : "s") + " x " +
         std::to_string(replicas_) + " replica" + (replicas_ == 1 ? "" : "s");
}

std::string data_parallel_group_name(int stage) { return "dp/stage" + std::to_string(stage); }
std::string pipeline_group_name(int replica) { return "pipe/replica" + std::to_string(replica); }
std::string tied_group_name(const std::string& key, int replica) {
  return "tied/" + key + "/replica" + std::to_string(replica);
}

}  // namespace pipetrain::comm
