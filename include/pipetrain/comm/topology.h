// The process grid: ranks <-> (pipe stage, data replica, tensor-parallel rank) coordinates and
// the rank sets of every process group derived from it (data-parallel, pipeline, tensor-parallel,
// tied weights).
//
// Axis order (as DeepSpeed's PipeModelDataParallelTopology): pipe outermost, then data, then the
// model (tensor-parallel) axis innermost, so rank = (stage * replicas + replica) * tensor + t.
// A tensor-parallel group, which talks in every layer, has consecutive ranks (one host); the
// replicas of one stage come next (the gradient all-reduce); pipe neighbours are farthest apart.
//
//   stages = 3, replicas = 2        replica 0   replica 1        (tensor = 1)
//                        stage 0       0           1
//                        stage 1       2           3
//                        stage 2       4           5
//
//   stages = 2, replicas = 1, tensor = 2: stage 0 = ranks {0, 1}, stage 1 = ranks {2, 3};
//   rank 1 sends its activations to rank 3.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pipetrain::comm {

struct Coord {
  int stage = 0;
  int replica = 0;
  int tensor = 0;  // index in the tensor-parallel group
  bool operator==(const Coord& o) const {
    return stage == o.stage && replica == o.replica && tensor == o.tensor;
  }
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
  // ConfigError when stages, replicas or tensor < 1.
  Topology(int stages, int replicas, int tensor = 1);

  // The grid for a job of `world_size` ranks. replicas == 0 infers world_size / (stages x
  // tensor). ConfigError when world_size != stages x replicas x tensor (naming them and the fix).
  static Topology for_world(int world_size, int stages, int replicas = 0, int tensor = 1);

  int stages() const { return stages_; }
  int replicas() const { return replicas_; }
  int tensor() const { return tensor_; }
  int world_size() const { return stages_ * replicas_ * tensor_; }

  Coord coord_of(int rank) const;  // ConfigError for a rank outside the grid
  int rank_of(int stage, int replica, int tensor = 0) const;
  int rank_of(Coord c) const { return rank_of(c.stage, c.replica, c.tensor); }
  int stage_of(int rank) const { return coord_of(rank).stage; }
  int replica_of(int rank) const { return coord_of(rank).replica; }
  int tensor_of(int rank) const { return coord_of(rank).tensor; }
  bool is_first_stage(int rank) const { return stage_of(rank) == 0; }
  bool is_last_stage(int rank) const { return stage_of(rank) == stages_ - 1; }

  // Pipe neighbours within the same replica and tensor-parallel index; nullopt at the ends.
  std::optional<int> prev_rank(int rank) const;
  std::optional<int> next_rank(int rank) const;
  // The neighbour `offset` stages away, wrapping around the pipe (interleaved schedules send
  // from the last stage back to the first).
  int pipe_neighbor(int rank, int offset) const;

  // Ranks holding `stage` (tensor-parallel index `tensor`) in every replica: its data-parallel
  // group.
  std::vector<int> data_parallel_ranks(int stage, int tensor = 0) const;
  // Ranks of every stage of `replica` (index `tensor`), in stage order: its pipeline.
  std::vector<int> pipeline_ranks(int replica, int tensor = 0) const;
  // The ranks sharing the layers of `stage` in `replica`: its tensor-parallel group.
  std::vector<int> tensor_parallel_ranks(int stage, int replica) const;
  // Ranks of `replica` (index `tensor`) holding one of `stages` (a tied-weight group), ascending.
  std::vector<int> tied_ranks(const std::vector<int>& stages, int replica, int tensor = 0) const;

  // Every group of the grid in one canonical order: data-parallel groups by stage, pipelines
  // by replica, tensor-parallel groups by stage and replica (when tensor > 1), then tied groups
  // by key and replica. Creating the groups a rank belongs to in this order on every rank
  // cannot deadlock. ConfigError for a tied key naming a stage outside the pipe, an empty or
  // duplicate key.
  std::vector<GroupSpec> groups(const std::vector<TiedKey>& tied = {}) const;

  // "stage 1 (rank 1)" for one replica, "stage 1, replica 0 (rank 2)" for several,
  // "stage 1, tensor 1 (rank 3)" with tensor parallelism.
  std::string describe_rank(int rank) const;
  // "2 stages x 2 replicas" (" x 2 tensor-parallel" when tensor > 1)
  std::string describe() const;

 private:
  int stages_;
  int replicas_;
  int tensor_;
};

// Group names used by Topology::groups.
// The tensor-parallel index is part of a name only when it is not 0, so grids without tensor
// parallelism keep their names.
std::string data_parallel_group_name(int stage, int tensor = 0);
std::string pipeline_group_name(int replica, int tensor = 0);
std::string tensor_parallel_group_name(int stage, int replica);
std::string tied_group_name(const std::string& key, int replica, int tensor = 0);

}  // namespace pipetrain::comm
