// Intra-op threads per rank.
#include "pipetrain/comm/threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

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

const std::vector<int>& process_cpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> out;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
    }
    return out;
  }();
  return cpus;
}

std::vector<int> plan_core_binding(const std::string& mode, const std::vector<int>& cpus, int local_rank,
                                   int local_world_size, int threads) {
  if (mode != "auto" && mode != "on" && mode != "off")
    throw ConfigError("bind_cores is \"" + mode + "\"; expected auto, on or off");
  if (local_rank < 0 || local_rank >= local_world_size)
    throw ConfigError(fmt::format("local rank {} is outside [0, {}) local ranks", local_rank, local_world_size));
  if (mode == "off") return {};
  const int64_t need = static_cast<int64_t>(local_world_size) * std::max(threads, 1);
  // auto binds only a job that fills the CPUs: with CPUs to spare another job may be running
  // beside it, and binding both jobs' ranks to the same first CPUs would idle the rest.
  if (mode == "auto" && need != static_cast<int64_t>(cpus.size())) return {};
  if (need > static_cast<int64_t>(cpus.size())) {
    throw ConfigError(fmt::format(
        "bind_cores \"on\": {} local ranks x {} threads need {} CPUs, this process may use {}; "
        "start fewer ranks or threads per rank, or set bind_cores to auto or off",
        local_world_size, threads, need, cpus.size()));
  }
  const auto first = cpus.begin() + static_cast<std::ptrdiff_t>(local_rank) * std::max(threads, 1);
  return {first, first + std::max(threads, 1)};
}

namespace {

bool set_affinity(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int c : cpus) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

}  // namespace

void bind_this_thread(const std::vector<int>& cpus) {
  (void)process_cpus();  // read before the first binding changes it
  if (cpus.empty() || set_affinity(cpus)) return;
  const int error = errno;
  std::string list;
  for (const int c : cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
  throw CommError(fmt::format("cannot bind this thread to CPUs {}: {}; set bind_cores to off",
                              list, std::strerror(error)));
}

}  // namespace pipetrain::comm
