// Intra-op threads per rank: split the host's cores between the ranks on it.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/comm/env.h"

namespace pipetrain::comm {

// Environment variables that carry a thread count to OpenMP, OpenBLAS and MKL (and to
// processes started later); `pipetrain launch` sets all of them for its ranks.
inline constexpr const char* kThreadEnvVars[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                 "MKL_NUM_THREADS"};

struct ThreadPlan {
  int threads = 1;
  std::string source;  // "requested", "OMP_NUM_THREADS", "4 cores / 2 local ranks"
};

// Cores this process may run on (its CPU affinity mask; hardware_concurrency as fallback).
int available_cores();

// The thread count for one rank: `requested` when > 0; else OMP_NUM_THREADS from `env` when
// set (the launcher or the user chose); else max(1, cores / local_world_size).
// ConfigError for a malformed OMP_NUM_THREADS or local_world_size < 1.
ThreadPlan plan_threads(int requested, const EnvLookup& env, int local_world_size, int cores);

// Applies a count to this process: at::set_num_threads (OpenMP pool, hence OpenBLAS-openmp),
// openblas_set_num_threads when that symbol is loaded, and the variables of kThreadEnvVars.
void apply_threads(int threads);

// plan_threads for this process (real environment and cores) followed by apply_threads.
ThreadPlan configure_threads(int requested, int local_world_size);

// Binding each rank's threads to cores of its own (DeepSpeed's launcher has
// --bind_cores_to_rank). Left to the scheduler, two busy ranks on two cores now and then share
// one while the other runs their helper threads: a send then waits milliseconds for the Gloo
// thread holding its connection, and some steps take 10-30% longer (docs/comm.md).

// The CPUs this process may run on, read once, before any binding (sorted).
const std::vector<int>& process_cpus();

// The CPUs of local rank `local_rank` among `cpus`: `threads` consecutive ones per local rank.
// mode "off": none (empty). "auto": only when the local ranks' threads fill `cpus` exactly
// (none when they need more, or leave some for another job). "on": whenever they fit;
// ConfigError (naming the counts) when they need more.
// ConfigError for another mode or local_rank outside [0, local_world_size).
std::vector<int> plan_core_binding(const std::string& mode, const std::vector<int>& cpus, int local_rank,
                                   int local_world_size, int threads);

// Restricts the calling thread, and the threads it starts from now on, to `cpus` (empty: no
// change). CommError when the system refuses.
void bind_this_thread(const std::vector<int>& cpus);

}  // namespace pipetrain::comm
