// Intra-op threads per rank.
#include "pipetrain/comm/threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <cstdlib>
#include <thread>

#include <ATen/Parallel.h>

#include "pipetrain/error.h"

namespace pipetrain::comm {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

ThreadPlan plan_threads(int requested, const EnvLookup& env, int local_world_size, int cores) {
  if (requested > 0) return {requested, "requested"};
  if (requested < 0) {
    throw ConfigError("threads per rank = " + std::to_string(requested) +
                      " is negative; give a count >= 1, or 0 for cores / local ranks");
  }
  if (env("OMP_NUM_THREADS")) {
    const int n = env_int(env, "OMP_NUM_THREADS",
                          "set it to the number of intra-op threads per rank (>= 1) or unset it",
                          1, 1 << 16);
    return {n, "OMP_NUM_THREADS"};
  }
  if (local_world_size < 1) {
    throw ConfigError("local world size " + std::to_string(local_world_size) +
                      " must be >= 1 to split the cores between local ranks");
  }
  const int n = std::max(1, cores / local_world_size);
  return {n, std::to_string(cores) + " cores / " + std::to_string(local_world_size) +
                 " local ranks"};
}

void apply_threads(int threads) {
  if (threads < 1) {
    throw ConfigError("thread count " + std::to_string(threads) + " must be >= 1");
  }
  const std::string value = std::to_string(threads);
  for (const char* name : kThreadEnvVars) setenv(name, value.c_str(), 1);
  at::set_num_threads(threads);
  // OpenBLAS built with pthreads keeps its own pool; the OpenMP build follows the OpenMP count
  // set above. Either way, tell it directly when it is loaded.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

ThreadPlan configure_threads(int requested, int local_world_size) {
  const ThreadPlan plan = plan_threads(requested, process_env(), local_world_size, available_cores());
  apply_threads(plan.threads);
  return plan;
}

}  // namespace pipetrain::comm
