// `pipetrain launch --nproc N [options] -- CMD ARGS...`: run N ranks of a command on this
// machine with torchrun's environment, forwarding signals and propagating the first failure.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "apps/commands.h"
#include "pipetrain/comm/launcher.h"

namespace pipetrain::apps {

void add_launch_command(CLI::App& app, int& exit_code) {
  struct Args {
    int nproc = 0;
    std::string master_addr = "127.0.0.1";
    int master_port = 0;
    int threads_per_rank = 0;
    double grace_period = comm::kDefaultGracePeriod.count() / 1000.0;
    double time_limit = 0;
    std::string log_dir;
    int max_restarts = 0;
    bool oversubscribe = false;
    std::vector<std::string> command;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "run N ranks of a command on this machine, with the environment torchrun sets (RANK, "
      "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); when one rank "
      "fails the others are stopped and its status is returned");
  sub->add_option("--nproc,-n", args->nproc, "number of ranks to start")->required()->check(positive());
  sub->add_option("--master-addr", args->master_addr, "address of rank 0's rendezvous store")
      ->capture_default_str();
  sub->add_option("--master-port", args->master_port, "its port; 0 picks a free one")->capture_default_str();
  sub->add_option("--threads-per-rank", args->threads_per_rank,
                  "intra-op threads of each rank (OMP_NUM_THREADS...); 0: cores / nproc")
      ->capture_default_str();
  sub->add_option("--grace-period", args->grace_period,
                  "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  sub->add_option("--time-limit", args->time_limit, "stop every rank after this many seconds (0: no limit)")
      ->capture_default_str();
  sub->add_option("--log-dir", args->log_dir, "write rank r's output to <dir>/rank_<r>.log");
  sub->add_option("--max-restarts", args->max_restarts,
                  "when a rank fails, restart the whole group up to K times (PIPETRAIN_RESTART_COUNT / "
                  "TORCHELASTIC_RESTART_COUNT tell the ranks, which resume from their checkpoint)")
      ->check(non_negative())
      ->capture_default_str();
  sub->add_flag("--oversubscribe", args->oversubscribe, "start the ranks even when they are more than 8 per core");
  sub->add_option("command", args->command, "the command to run and its arguments, after --")->required();
  sub->footer("Example: pipetrain launch --nproc 2 -- pipetrain train --config mlp.json");
  sub->callback([args, &exit_code] {
    comm::LaunchOptions options;
    options.nproc(args->nproc)
        .master_addr(args->master_addr)
        .master_port(args->master_port)
        .threads_per_rank(args->threads_per_rank)
        .grace_period(std::chrono::milliseconds(static_cast<int64_t>(args->grace_period * 1000)))
        .time_limit(std::chrono::milliseconds(static_cast<int64_t>(args->time_limit * 1000)))
        .log_dir(args->log_dir)
        .oversubscribe(args->oversubscribe);
    const comm::LaunchResult result =
        comm::launch_with_restarts(args->command, options, args->max_restarts, [&](const auto& failed, int restart) {
          std::cerr << fmt::format("pipetrain launch: {}; restarting all ranks ({} of {})\n", failed.message, restart,
                                   args->max_restarts);
        });
    if (result.exit_code != 0) std::cerr << "pipetrain launch: " << result.message << "\n";
    exit_code = result.exit_code;
  });
}

}  // namespace pipetrain::apps
