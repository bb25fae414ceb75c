// Rendezvous parsing for torchrun, OpenMPI and Slurm environments, Slurm host lists, threads.
#include <gtest/gtest.h>
#include <sched.h>

#include <thread>

#include "pipetrain/comm/rank_info.h"
#include "pipetrain/comm/slurm_hostlist.h"
#include "pipetrain/comm/threads.h"
#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace {

using Env = std::map<std::string, std::string>;

RankInfo parse(Env env) { return parse_rank_info(fake_env(std::move(env))); }

// The message of the ConfigError `fn` throws ("" if it throws none).
template <typename Fn>
std::string config_error(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

Env torchrun(int rank, int world) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "10.0.0.7"},          {"MASTER_PORT", "29511"}};
}

Env openmpi(int rank, int world, int local_size) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(world)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank % local_size)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size)},
          {"OMPI_MCA_ess_base_jobid", "1178927105"}};
}

Env slurm(int rank) {
  return {{"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", "6"},
          {"SLURM_LOCALID", std::to_string(rank % 2)},
          {"SLURM_NODEID", std::to_string(rank / 2)},
          {"SLURM_TASKS_PER_NODE", "2(x3)"},
          {"SLURM_JOB_NODELIST", "gpu[07-09]"},
          {"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "1"}};
}

TEST(RankInfo, Torchrun) {
  {  // NoLauncherIsOneProcess
    const RankInfo info = parse({});
    EXPECT_EQ(info.launcher, Launcher::None);
    EXPECT_EQ(info.rank, 0);
    EXPECT_EQ(info.world_size, 1);
    EXPECT_EQ(info.local_world_size, 1);
    EXPECT_EQ(info.master_addr, "127.0.0.1");
    EXPECT_EQ(info.master_port, 0);
  }
  {  // Torchrun
    const RankInfo info = parse(torchrun(3, 4));
    EXPECT_EQ(info.launcher, Launcher::Torchrun);
    EXPECT_EQ(info.rank, 3);
    EXPECT_EQ(info.world_size, 4);
    EXPECT_EQ(info.local_rank, 3);
    EXPECT_EQ(info.local_world_size, 4);
    EXPECT_EQ(info.master_addr, "10.0.0.7");
    EXPECT_EQ(info.master_port, 29511);
    EXPECT_EQ(info.describe(), "rank 3 of 4 (local 3 of 4) via torchrun, master 10.0.0.7:29511");
  }
  {  // TorchrunTwoHosts
    Env env = torchrun(5, 8);
    env["LOCAL_RANK"] = "1";
    env["LOCAL_WORLD_SIZE"] = "4";
    const RankInfo info = parse(env);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 4);
  }
  {  // TorchrunWithoutLocalVariablesAssumesOneHost
    Env env = torchrun(1, 2);
    env.erase("LOCAL_RANK");
    env.erase("LOCAL_WORLD_SIZE");
    const RankInfo info = parse(env);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 2);
    ASSERT_EQ(info.notes.size(), 1u);
    EXPECT_NE(info.notes[0].find("assuming all ranks on this host"), std::string::npos);
  }
  {  // TorchrunAgentStore: torchrun's agent serves the store; a restart reads keys of its own
    Env env = torchrun(1, 2);
    EXPECT_FALSE(parse(env).agent_store);
    env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
    EXPECT_FALSE(parse(env).agent_store);
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    env["TORCHELASTIC_RESTART_COUNT"] = "2";
    EXPECT_TRUE(parse(env).agent_store);
    EXPECT_EQ(parse(env).restart_count, 2);
    Env one = torchrun(0, 1);  // a single worker joins the agent's store too
    one["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    EXPECT_TRUE(parse(one).agent_store);
    EXPECT_EQ(parse(one).restart_count, 0);
  }
  {  // TorchrunTakesPrecedenceOverOpenMpi
    Env env = openmpi(1, 2, 2);
    for (auto& [k, v] : torchrun(0, 2)) env[k] = v;
    EXPECT_EQ(parse(env).launcher, Launcher::Torchrun);
    EXPECT_EQ(parse(env).rank, 0);
  }
}

TEST(RankInfo, TorchrunErrorsNameTheVariableAndTheFix) {
  Env missing_world = torchrun(0, 2);
  missing_world.erase("WORLD_SIZE");
  EXPECT_NE(config_error([&] { parse(missing_world); }).find("WORLD_SIZE is not set"), std::string::npos);

  Env missing_port = torchrun(0, 2);
  missing_port.erase("MASTER_PORT");
  const std::string port = config_error([&] { parse(missing_port); });
  EXPECT_NE(port.find("MASTER_PORT is not set"), std::string::npos) << port;
  EXPECT_NE(port.find("free TCP port"), std::string::npos) << port;

  Env missing_addr = torchrun(0, 2);
  missing_addr.erase("MASTER_ADDR");
  EXPECT_NE(config_error([&] { parse(missing_addr); }).find("MASTER_ADDR is not set"), std::string::npos);

  const std::string rank = config_error([] { parse(torchrun(4, 4)); });
  EXPECT_NE(rank.find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos) << rank;

  Env bad = torchrun(0, 2);
  bad["RANK"] = "one";
  EXPECT_NE(config_error([&] { parse(bad); }).find("RANK='one' is not an integer"), std::string::npos);

  Env half_local = torchrun(0, 2);
  half_local.erase("LOCAL_WORLD_SIZE");
  EXPECT_NE(config_error([&] { parse(half_local); }).find("LOCAL_WORLD_SIZE is not set but LOCAL_RANK is"),
            std::string::npos);

  Env local = torchrun(0, 2);
  local["LOCAL_RANK"] = "2";
  EXPECT_NE(config_error([&] { parse(local); }).find("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
            std::string::npos);

  Env port_range = torchrun(0, 2);
  port_range["MASTER_PORT"] = "70000";
  EXPECT_NE(config_error([&] { parse(port_range); }).find("MASTER_PORT='70000'"), std::string::npos);
}

TEST(RankInfo, OpenMpi) {
  {  // OpenMpiOneHostDerivesAddressAndPort
    const RankInfo info = parse(openmpi(1, 2, 2));
    EXPECT_EQ(info.launcher, Launcher::OpenMPI);
    EXPECT_EQ(info.rank, 1);
    EXPECT_EQ(info.world_size, 2);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.master_addr, "127.0.0.1");
    EXPECT_EQ(info.master_port, derived_master_port("1178927105"));
    EXPECT_GE(info.master_port, kDerivedPortBase);
    EXPECT_LT(info.master_port, kDerivedPortBase + kDerivedPortRange);
    EXPECT_EQ(info.notes.size(), 2u);
    // Every rank of the job derives the same port.
    EXPECT_EQ(parse(openmpi(0, 2, 2)).master_port, info.master_port);
  }
  {  // OpenMpiExplicitMasterWins
    Env env = openmpi(3, 4, 2);
    env["MASTER_ADDR"] = "node1";
    env["MASTER_PORT"] = "31000";
    const RankInfo info = parse(env);
    EXPECT_EQ(info.master_addr, "node1");
    EXPECT_EQ(info.master_port, 31000);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 2);
  }
  {  // OpenMpiSeveralHostsNeedMasterAddr
    const std::string e = config_error([] { parse(openmpi(3, 4, 2)); });
    EXPECT_NE(e.find("MASTER_ADDR is not set and the ranks span several hosts"), std::string::npos) << e;
    EXPECT_NE(e.find("mpirun -x MASTER_ADDR"), std::string::npos) << e;
  }
  {  // OpenMpiMissingLocalSize
    Env env = openmpi(0, 2, 2);
    env.erase("OMPI_COMM_WORLD_LOCAL_SIZE");
    EXPECT_NE(config_error([&] { parse(env); }).find("OMPI_COMM_WORLD_LOCAL_SIZE is not set"), std::string::npos);
  }
}

TEST(RankInfo, Slurm) {
  {  // Slurm
    const RankInfo info = parse(slurm(5));
    EXPECT_EQ(info.launcher, Launcher::Slurm);
    EXPECT_EQ(info.rank, 5);
    EXPECT_EQ(info.world_size, 6);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 2);
    EXPECT_EQ(info.master_addr, "gpu07");
    EXPECT_EQ(info.master_port, derived_master_port("4242.1"));
  }
  {  // SlurmUnevenNodes
    Env env = slurm(4);
    env["SLURM_NTASKS"] = "5";
    env["SLURM_TASKS_PER_NODE"] = "2(x2),1";
    env["SLURM_LOCALID"] = "0";
    env["SLURM_NODEID"] = "2";
    const RankInfo info = parse(env);
    EXPECT_EQ(info.local_world_size, 1);
  }
  {  // SbatchScriptWithoutSrunIsOneProcess
    Env env = slurm(0);
    env.erase("SLURM_STEP_ID");
    const RankInfo info = parse(env);
    EXPECT_EQ(info.launcher, Launcher::None);
    ASSERT_EQ(info.notes.size(), 1u);
    EXPECT_NE(info.notes[0].find("start the ranks with srun"), std::string::npos);
  }
  {  // SlurmErrors
    Env env = slurm(0);
    env.erase("SLURM_LOCALID");
    EXPECT_NE(config_error([&] { parse(env); }).find("SLURM_LOCALID is not set"), std::string::npos);
    Env no_tasks = slurm(0);
    no_tasks.erase("SLURM_TASKS_PER_NODE");
    EXPECT_NE(config_error([&] { parse(no_tasks); }).find("SLURM_TASKS_PER_NODE is not set"), std::string::npos);
    Env bad_list = slurm(0);
    bad_list["SLURM_JOB_NODELIST"] = "gpu[07-09";
    EXPECT_NE(config_error([&] { parse(bad_list); }).find("not a Slurm host list"), std::string::npos);
  }
}

TEST(SlurmHostlist, FirstHostAndTaskCounts) {
  {  // FirstHost
    EXPECT_EQ(slurm_first_host("node01"), "node01");
    EXPECT_EQ(slurm_first_host("node[01-04,07],gpu3"), "node01");
    EXPECT_EQ(slurm_first_host("node[7,1-3]"), "node7");
    EXPECT_EQ(slurm_first_host("rack[2-3]-n[005,9]"), "rack2-n005");
    EXPECT_EQ(slurm_first_host("a,b"), "a");
    EXPECT_THROW(slurm_first_host(""), ConfigError);
    EXPECT_THROW(slurm_first_host("n[a-b]"), ConfigError);
    EXPECT_THROW(slurm_first_host("n]1["), ConfigError);
  }
  {  // TasksPerNode
    EXPECT_EQ(slurm_tasks_per_node("4"), (std::vector<int>{4}));
    EXPECT_EQ(slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
    EXPECT_THROW(slurm_tasks_per_node("2(x3"), ConfigError);
    EXPECT_THROW(slurm_tasks_per_node("0"), ConfigError);
    EXPECT_THROW(slurm_tasks_per_node("2,"), ConfigError);
  }
  {  // StableAndInRange
    EXPECT_EQ(derived_master_port("abc"), derived_master_port("abc"));
    EXPECT_NE(derived_master_port("4242.0"), derived_master_port("4242.1"));
    for (int i = 0; i < 100; ++i) {
      const int p = derived_master_port(std::to_string(i));
      EXPECT_GE(p, kDerivedPortBase);
      EXPECT_LT(p, kDerivedPortBase + kDerivedPortRange);
    }
  }
}

TEST(Threads, PlanAndApply) {
  {  // Plan
    EXPECT_EQ(plan_threads(3, fake_env({{"OMP_NUM_THREADS", "1"}}), 2, 8).threads, 3);
    const ThreadPlan from_env = plan_threads(0, fake_env({{"OMP_NUM_THREADS", "2"}}), 2, 8);
    EXPECT_EQ(from_env.threads, 2);
    EXPECT_EQ(from_env.source, "OMP_NUM_THREADS");
    const ThreadPlan split = plan_threads(0, fake_env({}), 2, 8);
    EXPECT_EQ(split.threads, 4);
    EXPECT_EQ(split.source, "8 cores / 2 local ranks");
    EXPECT_EQ(plan_threads(0, fake_env({}), 4, 2).threads, 1);  // never below one
    EXPECT_THROW(plan_threads(0, fake_env({{"OMP_NUM_THREADS", "x"}}), 1, 2), ConfigError);
    EXPECT_THROW(plan_threads(-1, fake_env({}), 1, 2), ConfigError);
  }
  {  // ApplySetsTorchAndEnvironment
    const int before = at::get_num_threads();
    apply_threads(2);
    EXPECT_EQ(at::get_num_threads(), 2);
    EXPECT_STREQ(std::getenv("OMP_NUM_THREADS"), "2");
    EXPECT_STREQ(std::getenv("OPENBLAS_NUM_THREADS"), "2");
    apply_threads(before);
    EXPECT_THROW(apply_threads(0), ConfigError);
    EXPECT_GE(available_cores(), 1);
  }
}

TEST(Threads, CoreBindingPlanAndApply) {
  {  // Plan: consecutive CPUs of the allowed ones per local rank, in rank order
    const std::vector<int> cpus{2, 3, 6, 7};
    EXPECT_EQ(plan_core_binding("auto", cpus, 0, 2, 2), std::vector<int>({2, 3}));
    EXPECT_EQ(plan_core_binding("auto", cpus, 1, 2, 2), std::vector<int>({6, 7}));
    EXPECT_EQ(plan_core_binding("auto", cpus, 3, 4, 1), std::vector<int>({7}));
    EXPECT_EQ(plan_core_binding("auto", {0, 1}, 1, 2, 1), std::vector<int>({1}));
    EXPECT_TRUE(plan_core_binding("off", cpus, 0, 2, 2).empty());
    // CPUs to spare: another job may share them, so auto leaves placement to the scheduler;
    // on binds all the same.
    EXPECT_TRUE(plan_core_binding("auto", cpus, 1, 2, 1).empty());
    EXPECT_EQ(plan_core_binding("on", cpus, 1, 2, 1), std::vector<int>({3}));
    // More ranks x threads than CPUs: auto leaves them to the scheduler, on refuses.
    EXPECT_TRUE(plan_core_binding("auto", cpus, 0, 4, 2).empty());
    EXPECT_TRUE(plan_core_binding("auto", {0, 1}, 2, 4, 1).empty());
    try {
      plan_core_binding("on", {0, 1}, 0, 4, 1);
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("4 local ranks x 1 threads need 4 CPUs, this process may use 2"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(plan_core_binding("yes", cpus, 0, 2, 1), ConfigError);
    EXPECT_THROW(plan_core_binding("auto", cpus, 2, 2, 1), ConfigError);
  }
  {  // Apply: the thread and the threads it starts stay on the CPUs; the process keeps its set
    const std::vector<int> all = process_cpus();
    ASSERT_FALSE(all.empty());
    std::vector<int> seen, seen_by_child;
    auto affinity = [] {
      cpu_set_t set;
      CPU_ZERO(&set);
      std::vector<int> out;
      if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
          if (CPU_ISSET(c, &set)) out.push_back(c);
      return out;
    };
    std::thread([&] {
      bind_this_thread({all.back()});
      seen = affinity();
      std::thread([&] { seen_by_child = affinity(); }).join();
      bind_this_thread({});  // no change
      EXPECT_EQ(affinity(), std::vector<int>({all.back()}));
    }).join();
    EXPECT_EQ(seen, std::vector<int>({all.back()}));
    EXPECT_EQ(seen_by_child, std::vector<int>({all.back()}));
    EXPECT_EQ(affinity(), all);  // this thread was not touched
    EXPECT_EQ(process_cpus(), all);
    EXPECT_THROW(bind_this_thread({CPU_SETSIZE - 1}), CommError);  // no such CPU here
  }
}

}  // namespace
}  // namespace pipetrain::comm
