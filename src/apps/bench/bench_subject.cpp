// `pipetrain bench`'s subjects: the WORKLOADS.md workloads and the example models.
#include "apps/bench/bench_subject.h"

#include <fmt/format.h>

#include "apps/bench/mlp_workload.h"
#include "apps/examples/example.h"
#include "pipetrain/error.h"

namespace pipetrain::apps {

BenchShape bench_shape(const std::string& workload, const std::string& example) {
  if (workload.empty() == example.empty())
    throw ConfigError("give exactly one of --workload (mlp, mlp-4) and --example (cnn, gpt, mlp)");
  BenchShape s;
  if (!workload.empty()) {
    const auto w = make_mlp_workload(workload);
    s.rows = MlpWorkload::kRows;
    s.micro_batches = w.micro_batches;
    s.stages = w.stages;
  } else {
    const auto ex = examples::make_example(example);
    s.rows = ex.defaults.micro_batch_size * ex.defaults.micro_batches;
    s.micro_batches = static_cast<int>(ex.defaults.micro_batches);
    s.stages = static_cast<int>(ex.defaults.pipeline_stages);
  }
  return s;
}

BenchSubject bench_subject(const std::string& workload, const std::string& example, int micro_batches, int replica,
                           int replicas) {
  const BenchShape shape = bench_shape(workload, example);
  const int m = micro_batches > 0 ? micro_batches : shape.micro_batches;
  if (shape.rows % m != 0)
    throw ConfigError(
        fmt::format("--micro-batches {} does not divide the step's {} rows; use a divisor of {}", m, shape.rows, shape.rows));
  const int64_t rows = shape.rows / m;
  BenchSubject s;
  s.rows = shape.rows;
  s.default_stages = shape.stages;
  if (!workload.empty()) {
    auto w = make_mlp_workload(workload);
    s.name = workload;
    s.module = mlp_pipeline_module(w);
    s.flops_per_step = MlpWorkload::kFlopsPerStep;
    EngineConfig& c = s.config;
    c.optimizer.type = "SGD";
    c.optimizer.lr = MlpWorkload::kLr;
    c.pipeline.partition_method = "uniform";
    // Every replica trains on the workload's batch (replicas multiply the samples per step).
    for (int i = 0; i < m; ++i)
      s.micro_batches.push_back({Batch(w.x.narrow(0, i * rows, rows)), Batch(w.y.narrow(0, i * rows, rows))});
  } else {
    auto ex = examples::make_example(
        example, examples::ExampleOptions().replicas(replicas).micro_batches(m).micro_batch_size(rows));
    s.name = example;
    s.workload = false;
    s.module = PipelineModule{ex.layers, ex.loss};
    s.config = ex.engine_config();
    for (int i = 0; i < m; ++i) s.micro_batches.push_back(ex.train_micro_batch(0, replica, i));
  }
  s.config.train_micro_batch_size_per_gpu = rows;
  s.config.gradient_accumulation_steps = m;
  s.config.train_batch_size = rows * m * replicas;
  s.config.steps_per_print = 0;
  return s;
}

}  // namespace pipetrain::apps
