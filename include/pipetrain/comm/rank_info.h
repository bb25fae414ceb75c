// Who this process is in the job: rank, world size, local rank and the rendezvous address,
// read from the environment that torchrun, OpenMPI's mpirun or Slurm's srun sets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/comm/env.h"

namespace pipetrain::comm {

// The port torch.distributed uses when none is given; ours too under torchrun-style launches.
constexpr int kDefaultMasterPort = 29500;
// Ports derived from a job id (mpirun, srun without MASTER_PORT) fall in
// [kDerivedPortBase, kDerivedPortBase + kDerivedPortRange), below Linux's ephemeral range.
constexpr int kDerivedPortBase = 20000;
constexpr int kDerivedPortRange = 10000;

enum class Launcher {
  None,      // no launcher variables: a single process, rank 0 of 1
  Torchrun,  // RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  OpenMPI,   // OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE
  Slurm,     // SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST ...
};
std::string to_string(Launcher launcher);

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // index among the ranks on this host
  int local_world_size = 1;  // ranks on this host (splits the cores between them)
  std::string master_addr = "127.0.0.1";  // host of rank 0, which serves the TCPStore
  int master_port = 0;       // 0: a single process picks a free port itself
  Launcher launcher = Launcher::None;
  // torchrun's elastic agent already serves the TCPStore on master_addr:master_port
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0 included, joins it as a client,
  // under a prefix of its restart attempt (TORCHELASTIC_RESTART_COUNT) as torch.distributed does.
  bool agent_store = false;
  int restart_count = 0;
  // How master_addr/master_port were obtained when the launcher did not set them
  // ("MASTER_PORT derived from OMPI_MCA_ess_base_jobid"), for logs.
  std::vector<std::string> notes;

  // "rank 1 of 4 (local 1 of 2) via torchrun, master 127.0.0.1:29500"
  std::string describe() const;
};

// Reads the rank from `env`. Precedence when several launchers' variables are present:
// torchrun (RANK/WORLD_SIZE; also set by `pipetrain launch`), then OpenMPI, then Slurm; with
// none of them the process is rank 0 of 1. MASTER_ADDR and MASTER_PORT always win when set.
// Missing or inconsistent variables raise ConfigError naming the variable and the fix.
RankInfo parse_rank_info(const EnvLookup& env);

// parse_rank_info(process_env()).
RankInfo rank_info_from_env();

// The port a launcher job id maps to when MASTER_PORT is not set:
// kDerivedPortBase + (FNV-1a hash of job_id) % kDerivedPortRange. Every rank of one job
// derives the same port; two jobs on one host almost never collide.
int derived_master_port(const std::string& job_id);

}  // namespace pipetrain::comm
