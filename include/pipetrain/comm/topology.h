// The process grid: ranks <-> (pipe stage, data replica) coordinates and the rank sets of
// every process group derived from it (data-parallel, pipeline, tied weights).
//
// Axis order (as DeepSpeed's PipeDataParallelTopology): the pipe axis is outermost and the
// data axis innermost, so rank = stage * replicas + replica. The replicas of one stage have
// consecutive ranks (their gradient all-reduce, the largest transfer, stays on one host when
// hosts hold consecutive ranks); pipe neighbours are `replicas` ranks apart.
//
//   stages = 3, replicas = 2        replica 0   replica 1
//                        stage 0       0           1
//                        stage 1       2           3
//                        stage 2       4           5
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pipetrain::comm {

struct Coord {
  int stage = 0;
  int replica = 0;
  bool operator==(const Coord& o) const { return stage == o.stage && replica == o.replica; }
};

// Layers shared by several stages (e.g. a token embedding reused as the output projection):
// the stages holding a copy of the module registered under `key`.
struct TiedKey {
  std::string key;
  std::vector<int> stages;
};

// A process group: a stable name (the store prefix of the group) and its ranks, ascending.
struct GroupSpec {
  std::string name;
  std::vector<int> ranks;
  bool contains(int rank) const;
};

class Topology {
 public:
  // ConfigError when stages or replicas < 1.
  Topology(int stages, int replicas);

  // The grid for a job of `world_size` ranks. replicas == 0 infers world_size / stages.
  // ConfigError when world_size != stages x replicas (naming both and the fix).
  static Topology for_world(int world_size, int stages, int replicas = 0);

  int stages() const { return stages_; }
  int replicas() const { return replicas_; }
  int world_size() const { return stages_ * replicas_; }

  Coord coord_of(int rank) const;  // ConfigError for a rank outside the grid
  int rank_of(int stage, int replica) const;
  int rank_of(Coord c) const { return rank_of(c.stage, c.replica); }
  int stage_of(int rank) const { return coord_of(rank).stage; }
  int replica_of(int rank) const { return coord_of(rank).replica; }
  bool is_first_stage(int rank) const { return stage_of(rank) == 0; }
  bool is_last_stage(int rank) const { return stage_of(rank) == stages_ - 1; }

  // Pipe neighbours within the same replica; nullopt at the ends of the pipe.
  std::optional<int> prev_rank(int rank) const;
  std::optional<int> next_rank(int rank) const;
  // The neighbour `offset` stages away, wrapping around the pipe (interleaved schedules send
  // from the last stage back to the first).
  int pipe_neighbor(int rank, int offset) const;

  // Ranks holding `stage` in every replica (its data-parallel group).
  std::vector<int> data_parallel_ranks(int stage) const;
  // Ranks of every stage of `replica`, in stage order (its pipeline).
  std::vector<int> pipeline_ranks(int replica) const;
  // Ranks of `replica` holding one of `stages` (a tied-weight group), ascending.
  std::vector<int> tied_ranks(const std::vector<int>& stages, int replica) const;

  // Every group of the grid in one canonical order: data-parallel groups by stage, pipelines
  // by replica, then tied groups by key and replica. Creating the groups a rank belongs to in
  // this order on every rank cannot deadlock. ConfigError for a tied key naming a stage
  // outside the pipe, an empty or duplicate key.
  std::vector<GroupSpec> groups(const std::vector<TiedKey>& tied = {}) const;

  // "stage 1 (rank 1)" for one replica, "stage 1, replica 0 (rank 2)" for several.
  std::string describe_rank(int rank) const;
  // "2 stages x 2 replicas"
  std::string describe() const;

 private:
  int stages_;
  int replicas_;
};

// Group names used by Topology::groups.
std::string data_parallel_group_name(int stage);
std::string pipeline_group_name(int replica);
std::string tied_group_name(const std::string& key, int replica);

}  // namespace pipetrain::comm
