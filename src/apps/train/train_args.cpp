// Command-line options of `pipetrain train`.
#include "apps/train/train_args.h"

#include "apps/commands.h"
#include "apps/examples/example.h"
#include "apps/plan/plan_file.h"
#include "pipetrain/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pipetrain::apps {

std::vector<std::string> TrainArgs::worker_arguments() const {
  std::vector<std::string> a{"train", "--worker", "--example", example, "--replicas", std::to_string(replicas),
                             "--run-dir", run_dir, "--sample-length", std::to_string(sample_length)};
  auto add = [&](const char* flag, auto value, bool when) {
    if (when) a.insert(a.end(), {flag, fmt::format("{}", value)});
  };
  add("--stages", stages, stages > 0);
  add("--micro-batches", micro_batches, micro_batches > 0);
  add("--micro-batch-size", micro_batch_size, micro_batch_size > 0);
  add("--schedule", schedule, !schedule.empty());
  add("--precision", precision, !precision.empty());
  add("--zero-stage", zero_stage, zero_stage >= 0);
  add("--tensor-parallel", tensor_parallel, tensor_parallel > 0);
  add("--steps", steps, steps > 0);
  add("--epochs", epochs, epochs > 0);
  add("--config", config_file, !config_file.empty());
  add("--plan", plan, !plan.empty());
  add("--balance", fmt::format("{}", fmt::join(balance, ",")), !balance.empty());
  add("--eval-every", eval_every, eval_every > 0);
  add("--eval-samples", eval_samples, eval_samples > 0);
  add("--dropout", dropout, dropout > 0);
  add("--log-every", log_every, log_every > 0);
  add("--checkpoint-every", checkpoint_every, checkpoint_every > 0);
  if (resume) a.push_back("--resume");
  return a;
}

void apply_plan_file(TrainArgs& args, bool example_given) {
  if (args.plan.empty()) return;
  const PlanSpec plan = read_plan_file(args.plan);
  // The workloads are the "mlp" example's model.
  const std::string example = !plan.example.empty() ? plan.example : !plan.workload.empty() ? "mlp" : args.example;
  if (example_given && example != args.example)
    throw ConfigError(fmt::format("--plan {} was made for {}, not --example {}; plan that example or drop --example",
                                  args.plan, example, args.example));
  args.example = example;
  args.stages = plan.stages;
  args.replicas = plan.replicas;
  args.micro_batches = plan.micro_batches;
  if (plan.micro_batch_size > 0) args.micro_batch_size = static_cast<int>(plan.micro_batch_size);
  args.schedule = plan.schedule;
}

void add_train_options(CLI::App& sub, const std::shared_ptr<TrainArgs>& args) {
  sub.add_option("--example", args->example, "cnn (Fashion-MNIST, the default), gpt (char-level on fortunes), mlp or resnet (Fashion-MNIST with skips)")
      ->check(CLI::IsMember(examples::example_names()))
      ->capture_default_str();
  sub.add_option("--stages", args->stages, "pipeline stages, one process each (default 2)")->check(positive());
  sub.add_option("--replicas", args->replicas, "data-parallel replicas (processes = stages x replicas)")
      ->check(positive())
      ->capture_default_str();
  sub.add_option("--micro-batches", args->micro_batches, "micro-batches per step (gradient accumulation)")
      ->check(positive());
  sub.add_option("--micro-batch-size", args->micro_batch_size, "rows per micro-batch")->check(positive());
  sub.add_option("--precision", args->precision,
                 "fp32, bf16 or fp16: what the layers compute in (float32 master weights); overrides the "
                 "config's bf16/fp16 blocks")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub.add_option("--tensor-parallel", args->tensor_parallel,
                 "ranks per tensor-parallel group (Megatron-style layers: gpt); processes = stages x replicas x this")
      ->check(positive());
  sub.add_option("--zero-stage", args->zero_stage,
                 "ZeRO stage: 1 shards the optimizer state across the replicas (zero_optimization.stage)")
      ->check(CLI::Range(0, 3));
  sub.add_option("--schedule", args->schedule, "1f1b (default), fill-drain, interleaved, zb-h1, zb-v, dualpipev, v-half or v-min")
      ->check(CLI::IsMember({"1f1b", "fill-drain", "interleaved", "zb-h1", "zb-v", "dualpipev", "v-half", "v-min"}));
  auto* steps = sub.add_option("--steps", args->steps, "optimizer steps to train")->check(positive());
  sub.add_option("--epochs", args->epochs, "passes over the training set (cnn)")
      ->check(positive())
      ->excludes(steps);
  sub.add_option("--config", args->config_file, "the engine's JSON config (DeepSpeed key names)")
      ->check(CLI::ExistingFile);
  sub.add_option("--plan", args->plan,
                 "train with a plan's layout, balance and checkpointing (pipetrain plan's output; its last "
                 "JSON line)")
      ->check(CLI::ExistingFile);
  sub.add_option("--balance", args->balance,
                 "layers per stage, comma-separated (e.g. 5,7); default: the split with the fastest predicted "
                 "step on the example's layers profiled here (the summary's split line says which and why)")
      ->delimiter(',')
      ->check(positive());
  sub.add_option("--run-dir", args->run_dir, "where metrics, plots, trace, checkpoint and summary go "
                                             "(default runs/<example>-<time>)");
  sub.add_flag("--resume", args->resume, "continue from the checkpoint in --run-dir (any stage count)");
  sub.add_option("--checkpoint-every", args->checkpoint_every,
                 "also save the checkpoint every N steps (a restart resumes from the latest)")
      ->check(non_negative());
  sub.add_option("--max-restarts", args->max_restarts,
                 "when a process fails, restart them all up to K times; they resume from the latest "
                 "checkpoint by themselves")
      ->check(non_negative());
  sub.add_option("--eval-every", args->eval_every, "evaluate every K steps as well as at the end");
  sub.add_option("--eval-samples", args->eval_samples, "evaluate on the first N samples only");
  sub.add_option("--dropout", args->dropout,
                 "dropout probability (gpt: GPT-2's attention, residual and embedding dropout; the "
                 "attention's is drawn per tensor-parallel rank)")
      ->check(CLI::Range(0.0, 0.999));
  sub.add_option("--log-every", args->log_every, "steps between progress lines when not on a terminal");
  sub.add_option("--threads-per-rank", args->threads_per_rank, "intra-op threads per process (0: cores / processes)");
  sub.add_flag("--oversubscribe", args->oversubscribe, "start the processes even when they are more than 8 per core");
  sub.add_option("--time-limit", args->time_limit, "stop every process after this many seconds (0: none)");
  sub.add_option("--sample-length", args->sample_length, "characters of generated text at the end (gpt)");
  sub.add_flag("--worker", args->worker, "internal: run as one rank")->group("");
}

}  // namespace pipetrain::apps
