// What `pipetrain bench` runs: a standard workload (WORKLOADS.md) or an example model, as the
// engine's module, its config and one fixed step of micro-batches.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/batch/data_iterator.h"
#include "pipetrain/engine/config.h"
#include "pipetrain/engine/pipeline_module.h"

namespace pipetrain::apps {

struct BenchSubject {
  std::string name;
  bool workload = true;  // a WORKLOADS.md workload (else an example)
  PipelineModule module;
  EngineConfig config;                   // optimizer, batch sizes for the micro-batch count
  std::vector<MicroBatch> micro_batches;  // the one step every timed step repeats (this replica)
  int64_t rows = 0;                      // per step and replica
  int default_stages = 2;
  double flops_per_step = 0;  // GEMM FLOPs per step and replica; 0: not known
};

// The rows of one step and replica and the default micro-batch count, without building data.
struct BenchShape {
  int64_t rows = 0;
  int micro_batches = 1;
  int stages = 2;
};
// Exactly one of `workload` ("mlp", "mlp-4") and `example` ("cnn", "gpt", "mlp") is non-empty;
// ConfigError otherwise.
BenchShape bench_shape(const std::string& workload, const std::string& example);

// The subject for `micro_batches` micro-batches (0: the default) of replica `replica` of
// `replicas`. ConfigError when the micro-batch count does not divide the step's rows.
BenchSubject bench_subject(const std::string& workload, const std::string& example, int micro_batches, int replica,
                           int replicas);

}  // namespace pipetrain::apps
