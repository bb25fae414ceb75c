// Rendezvous from the environment: torchrun, OpenMPI and Slurm variables -> RankInfo.
#include "pipetrain/comm/rank_info.h"

#include <cstdint>

#include "pipetrain/comm/slurm_hostlist.h"
#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace {

constexpr int kMaxWorld = 1 << 20;

bool has(const EnvLookup& env, const char* name) { return env(name).has_value(); }

std::optional<std::string> first_of(const EnvLookup& env, std::initializer_list<const char*> names,
                                    std::string* which = nullptr) {
  for (const char* name : names) {
    if (auto value = env(name)) {
      if (which) *which = name;
      return value;
    }
  }
  return std::nullopt;
}

int master_port_from(const EnvLookup& env) {
  return env_int(env, "MASTER_PORT",
                 "set it to a free TCP port on the host of rank 0 (e.g. MASTER_PORT=29500)", 1,
                 65535);
}

void check_consistent(const RankInfo& info, const std::string& rank_var, const std::string& size_var,
                      const std::string& local_var, const std::string& local_size_var) {
  if (info.rank >= info.world_size) {
    throw ConfigError(rank_var + "=" + std::to_string(info.rank) + " is not below " + size_var +
                      "=" + std::to_string(info.world_size) +
                      "; ranks are numbered 0 .. world size - 1: fix the launcher variables");
  }
  if (info.local_world_size > info.world_size) {
    throw ConfigError(local_size_var + "=" + std::to_string(info.local_world_size) +
                      " exceeds " + size_var + "=" + std::to_string(info.world_size) +
                      "; a host cannot run more ranks than the job has: fix the launcher variables");
  }
  if (info.local_rank >= info.local_world_size) {
    throw ConfigError(local_var + "=" + std::to_string(info.local_rank) + " is not below " +
                      local_size_var + "=" + std::to_string(info.local_world_size) +
                      "; fix the launcher variables");
  }
}

// MASTER_ADDR from the environment, else loopback when every rank runs on this host.
void resolve_master_addr(const EnvLookup& env, RankInfo& info, const std::string& hint) {
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) {
      throw ConfigError("MASTER_ADDR is set but empty; set it to the host name or address of "
                        "rank 0");
    }
    info.master_addr = *addr;
    return;
  }
  if (info.local_world_size == info.world_size) {
    info.master_addr = "127.0.0.1";
    info.notes.push_back("MASTER_ADDR not set; all " + std::to_string(info.world_size) +
                         " ranks run on this host, so rank 0 serves on 127.0.0.1");
    return;
  }
  throw ConfigError("MASTER_ADDR is not set and the ranks span several hosts (" +
                    std::to_string(info.local_world_size) + " of " +
                    std::to_string(info.world_size) +
                    " on this one); set MASTER_ADDR to the address of the host running rank 0" +
                    hint);
}

// torchrun's agent serving the store (torch.distributed compares the text with str(True); so do we).
void read_agent_store(const EnvLookup& env, RankInfo& info) {
  info.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (info.agent_store && has(env, "TORCHELASTIC_RESTART_COUNT")) {
    info.restart_count = env_int(env, "TORCHELASTIC_RESTART_COUNT",
                                 "torchrun's agent sets it to its restart attempt (0, 1, ...)", 0, kMaxWorld);
  }
}

RankInfo parse_torchrun(const EnvLookup& env) {
  const std::string fix =
      "torchrun and `pipetrain launch` set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
      "MASTER_ADDR and MASTER_PORT; when setting them by hand set all of them";
  RankInfo info;
  info.launcher = Launcher::Torchrun;
  info.world_size = env_int(env, "WORLD_SIZE", fix, 1, kMaxWorld);
  info.rank = env_int(env, "RANK", fix, 0, kMaxWorld);
  const bool has_local = has(env, "LOCAL_RANK");
  const bool has_local_size = has(env, "LOCAL_WORLD_SIZE");
  if (has_local != has_local_size) {
    throw ConfigError(std::string(has_local ? "LOCAL_WORLD_SIZE" : "LOCAL_RANK") +
                      " is not set but " + (has_local ? "LOCAL_RANK" : "LOCAL_WORLD_SIZE") +
                      " is; set both (the number of ranks on this host and this rank's index "
                      "among them)");
  }
  if (has_local) {
    info.local_world_size = env_int(env, "LOCAL_WORLD_SIZE", fix, 1, kMaxWorld);
    info.local_rank = env_int(env, "LOCAL_RANK", fix, 0, kMaxWorld);
  } else {
    info.local_world_size = info.world_size;
    info.local_rank = info.rank;
    info.notes.push_back("LOCAL_RANK/LOCAL_WORLD_SIZE not set; assuming all ranks on this host");
  }
  check_consistent(info, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  if (info.world_size == 1) {
    info.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
    info.master_port = has(env, "MASTER_PORT") ? master_port_from(env) : 0;
    read_agent_store(env, info);
    return info;
  }
  if (!has(env, "MASTER_ADDR")) {
    throw ConfigError("MASTER_ADDR is not set (RANK=" + std::to_string(info.rank) +
                      ", WORLD_SIZE=" + std::to_string(info.world_size) +
                      "); set it to the address of the host running rank 0, e.g. "
                      "MASTER_ADDR=127.0.0.1 on one machine");
  }
  resolve_master_addr(env, info, "");
  info.master_port = master_port_from(env);
  read_agent_store(env, info);
  return info;
}

void resolve_port(const EnvLookup& env, RankInfo& info, const std::string& job_id,
                  const std::string& job_var, const std::string& hint) {
  if (has(env, "MASTER_PORT")) {
    info.master_port = master_port_from(env);
    return;
  }
  if (job_id.empty()) {
    throw ConfigError("MASTER_PORT is not set and " + job_var +
                      " is missing to derive one; set MASTER_PORT to a free port" + hint);
  }
  info.master_port = derived_master_port(job_id);
  info.notes.push_back("MASTER_PORT not set; derived " + std::to_string(info.master_port) +
                       " from " + job_var + "=" + job_id);
}

RankInfo parse_openmpi(const EnvLookup& env) {
  const std::string fix =
      "mpirun sets OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE; start the ranks "
      "with mpirun (OpenMPI) or set the torchrun variables instead";
  RankInfo info;
  info.launcher = Launcher::OpenMPI;
  info.world_size = env_int(env, "OMPI_COMM_WORLD_SIZE", fix, 1, kMaxWorld);
  info.rank = env_int(env, "OMPI_COMM_WORLD_RANK", fix, 0, kMaxWorld);
  info.local_world_size = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", fix, 1, kMaxWorld);
  info.local_rank = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", fix, 0, kMaxWorld);
  check_consistent(info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string hint = " (mpirun -x MASTER_ADDR=host -x MASTER_PORT=port ...)";
  resolve_master_addr(env, info, hint);
  std::string job_var;
  const auto job = first_of(env, {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}, &job_var);
  resolve_port(env, info, job.value_or(""), job ? job_var : "OMPI_MCA_ess_base_jobid", hint);
  return info;
}

RankInfo parse_slurm(const EnvLookup& env) {
  const std::string fix =
      "srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and "
      "SLURM_TASKS_PER_NODE; start the ranks with srun";
  RankInfo info;
  info.launcher = Launcher::Slurm;
  info.rank = env_int(env, "SLURM_PROCID", fix, 0, kMaxWorld);
  info.world_size = env_int(env, has(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS",
                            fix, 1, kMaxWorld);
  info.local_rank = env_int(env, "SLURM_LOCALID", fix, 0, kMaxWorld);
  std::string tasks_var;
  if (auto tasks = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"},
                            &tasks_var)) {
    const auto counts = slurm_tasks_per_node(*tasks);
    const int node = has(env, "SLURM_NODEID") ? env_int(env, "SLURM_NODEID", fix, 0, kMaxWorld) : 0;
    if (node >= static_cast<int>(counts.size())) {
      throw ConfigError("SLURM_NODEID=" + std::to_string(node) + " has no entry in " +
                        tasks_var + "='" + *tasks + "'; " + fix);
    }
    info.local_world_size = counts[static_cast<size_t>(node)];
  } else if (has(env, "SLURM_NTASKS_PER_NODE")) {
    info.local_world_size = env_int(env, "SLURM_NTASKS_PER_NODE", fix, 1, kMaxWorld);
  } else {
    throw ConfigError("SLURM_TASKS_PER_NODE is not set; " + fix);
  }
  check_consistent(info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE");
  if (auto addr = env("MASTER_ADDR")) {
    info.master_addr = *addr;
  } else {
    std::string list_var;
    const auto list =
        first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_var);
    if (!list) {
      throw ConfigError("MASTER_ADDR and SLURM_NODELIST are both unset; set MASTER_ADDR to the "
                        "host of rank 0");
    }
    info.master_addr = slurm_first_host(*list);
    info.notes.push_back("MASTER_ADDR not set; using the first host of " + list_var + ": " +
                         info.master_addr);
  }
  std::string job = env("SLURM_JOB_ID").value_or(env("SLURM_JOBID").value_or(""));
  if (!job.empty()) job += "." + env("SLURM_STEP_ID").value_or(env("SLURM_STEPID").value_or("0"));
  resolve_port(env, info, job, "SLURM_JOB_ID", " (export MASTER_PORT=port before srun)");
  return info;
}

}  // namespace

std::string to_string(Launcher launcher) {
  switch (launcher) {
    case Launcher::None: return "no launcher";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::OpenMPI: return "OpenMPI";
    case Launcher::Slurm: return "Slurm";
  }
  return "unknown launcher";
}

std::string RankInfo::describe() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + " of " + std::to_string(local_world_size) + ") via " +
         to_string(launcher) + ", master " + master_addr + ":" + std::to_string(master_port);
}

int derived_master_port(const std::string& job_id) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a: stable across builds and hosts
  for (unsigned char c : job_id) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return kDerivedPortBase + static_cast<int>(hash % kDerivedPortRange);
}

RankInfo parse_rank_info(const EnvLookup& env) {
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) return parse_torchrun(env);
  if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) {
    return parse_openmpi(env);
  }
  // srun sets SLURM_STEP_ID; an sbatch script itself has SLURM_PROCID=0 but is not a rank.
  if (has(env, "SLURM_PROCID") && (has(env, "SLURM_STEP_ID") || has(env, "SLURM_STEPID"))) {
    return parse_slurm(env);
  }
  RankInfo info;
  if (has(env, "SLURM_PROCID")) {
    info.notes.push_back("SLURM_PROCID is set but SLURM_STEP_ID is not (an sbatch script?); "
                         "running as a single process: start the ranks with srun");
  }
  info.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
  info.master_port = has(env, "MASTER_PORT") ? master_port_from(env) : 0;
  return info;
}

RankInfo rank_info_from_env() { return parse_rank_info(process_env()); }

}  // namespace pipetrain::comm
