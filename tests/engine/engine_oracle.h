// The correctness oracle of the engine tests: train a PipelineModule over in-process ranks (one
// thread per rank) and the same layers in one process without a pipeline, then compare the
// losses and every parameter.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipetrain/comm/inprocess.h"
#include "pipetrain/error.h"
#include "pipetrain/engine/optimizer.h"
#include "pipetrain/engine/loss_scaler.h"
#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/runtime/autocast.h"

namespace pipetrain::testing {

// The micro-batch `m` of step `s` for data replica `r`.
using MicroBatchFn = std::function<MicroBatch(int64_t step, int replica, int micro)>;

struct OracleCase {
  std::function<PipelineModule()> module;  // called once per rank and once for the reference
  EngineConfig config;                     // batch sizes resolved by the engine
  int stages = 2;
  int replicas = 1;
  int steps = 3;
  MicroBatchFn data;
};

// A small SGD run: 4 rows per micro-batch, uniform partition, no printing.
inline EngineConfig oracle_config(int micro_batches, const std::string& schedule) {
  EngineConfig c;
  c.train_micro_batch_size_per_gpu = 4;
  c.gradient_accumulation_steps = micro_batches;
  c.steps_per_print = 0;
  c.optimizer.type = "SGD";
  c.optimizer.lr = 0.05;
  c.pipeline.schedule = schedule;
  c.pipeline.partition_method = "uniform";
  return c;
}

struct OracleRun {
  std::vector<double> losses;                      // per step
  std::vector<double> grad_norms;                  // per step: before clipping (NaN: skipped)
  int64_t kernel_summed = 0;                       // pipeline: gradients whose norm a kernel summed (last step)
  std::map<std::string, torch::Tensor> params;     // "<layer>.<name>" after the last step
  int64_t weight_pauses = 0;                       // pipeline: over every rank and step
};

// Parameter names of the layer list: each module under its first use.
inline std::map<std::string, torch::Tensor> named_by_first_use(const BuiltLayers& built) {
  std::map<std::string, torch::Tensor> out;
  std::set<const void*> seen;
  for (size_t i = 0; i < built.modules.size(); ++i) {
    if (!seen.insert(built.modules[i].ptr().get()).second) continue;
    for (const auto& item : built.modules[i].ptr()->named_parameters(true)) {
      out[std::to_string(built.begin + static_cast<int64_t>(i)) + "." + item.key()] = item.value().detach().clone();
    }
  }
  return out;
}

// One process, no pipeline: the same layers (same seeds), the same micro-batches, the loss of
// each micro-batch divided by micro-batches x replicas, clipping and the optimizer.
inline OracleRun reference_run(const OracleCase& c) {
  auto module = c.module();
  EngineConfig config = c.config;
  config.resolve_batch_sizes(c.replicas);
  const auto m = config.gradient_accumulation_steps;
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), config.seed);
  auto params = built.parameters();
  auto optimizer = make_optimizer(config.optimizer, params);
  // The same precision as the engine (autocast around the forward), and for fp16 the same
  // loss scaling: scaled backward, a skipped step on overflow, unscaled gradients otherwise.
  const auto dtype = runtime::compute_dtype(config.precision());
  std::optional<LossScaler> scaler;
  if (config.fp16.enabled) scaler.emplace(config.fp16);
  OracleRun run;
  for (int64_t s = 0; s < c.steps; ++s) {
    optimizer->zero_grad();
    double loss_sum = 0;
    const double scale = scaler ? scaler->scale() : 1.0;
    for (int r = 0; r < c.replicas; ++r) {
      for (int64_t i = 0; i < m; ++i) {
        auto mb = c.data(s, r, static_cast<int>(i));
        torch::Tensor loss;
        {
          runtime::AutocastScope autocast(torch::kCPU, dtype);
          loss = module.loss(built.forward(mb.inputs), mb.labels);
          if (loss.scalar_type() == torch::kHalf || loss.scalar_type() == torch::kBFloat16) loss = loss.to(torch::kFloat);
        }
        loss_sum += loss.item<double>();
        (loss * (scale / static_cast<double>(m * c.replicas))).backward();
      }
    }
    run.losses.push_back(loss_sum / static_cast<double>(m * c.replicas));
    if (scaler) {
      bool overflow = !std::isfinite(loss_sum);
      for (const auto& p : params) {
        if (p.grad().defined() && !torch::isfinite(p.grad()).all().item<bool>()) overflow = true;
      }
      scaler->update(overflow);
      if (overflow) {
        run.grad_norms.push_back(NAN);
        continue;
      }
      for (auto& p : params) {
        if (p.grad().defined()) p.mutable_grad().div_(scale);
      }
    }
    double sq = 0;
    for (const auto& p : params) {
      if (p.grad().defined()) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    }
    run.grad_norms.push_back(std::sqrt(sq));
    if (config.gradient_clipping > 0) torch::nn::utils::clip_grad_norm_(params, config.gradient_clipping);
    set_learning_rate(*optimizer, config.scheduler.lr_at(s, config.optimizer.lr));
    optimizer->step();
  }
  run.params = named_by_first_use(built);
  return run;
}

// The engine over stages x replicas threads. Parameters are collected from replica 0.
inline OracleRun pipeline_run(const OracleCase& c) {
  const int world = c.stages * c.replicas;
  auto hub = comm::InProcessHub::create(world);
  std::vector<OracleRun> runs(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        std::shared_ptr<comm::Communicator> comm = hub->endpoint(rank);
        auto module = c.module();
        module.num_stages = c.stages;
        PipelineEngine engine(std::move(module), c.config, comm);
        auto& run = runs[static_cast<size_t>(rank)];
        for (int64_t s = 0; s < c.steps; ++s) {
          int i = 0;
          FunctionIterator it([&]() -> std::optional<MicroBatch> {
            if (i >= engine.micro_batches()) return std::nullopt;
            return c.data(s, engine.replica(), i++);
          });
          run.losses.push_back(engine.train_batch(it));
          run.grad_norms.push_back(engine.last_step().grad_norm);
          run.weight_pauses += engine.last_step().weight_pauses;
        }
        for (const auto& p : engine.parameters()) {
          for (int chunk = 0; chunk < engine.num_chunks(); ++chunk) {
            if (engine.chunk(chunk).weight_grad_sqnorm(p)) ++run.kernel_summed;
          }
        }
        for (const auto& [name, p] : engine.named_parameters()) run.params[name] = p.detach().clone();
        comm->shutdown();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
        hub->fail(rank, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << "rank " << rank;
  }
  OracleRun merged;
  merged.losses = runs[0].losses;
  merged.grad_norms = runs[0].grad_norms;  // the global norm, agreed by every rank
  for (const auto& r : runs) {
    merged.weight_pauses += r.weight_pauses;
    merged.kernel_summed += r.kernel_summed;
  }
  for (int rank = 0; rank < world; ++rank) {
    for (int r = 0; r < world; ++r) EXPECT_EQ(runs[static_cast<size_t>(r)].losses.size(), merged.losses.size());
    if (rank % c.replicas != 0) continue;  // replica 0 of each stage
    for (const auto& [name, p] : runs[static_cast<size_t>(rank)].params) merged.params[name] = p;
  }
  return merged;
}

// Every parameter of the pipelined run equals the reference's (a tied module's later uses are
// compared with its first use), and so does every step's loss.
// `pipelined` (optional) receives the pipelined run.
inline void expect_same_training(const OracleCase& c, double rtol = 1e-4, double atol = 1e-6,
                                 OracleRun* pipelined = nullptr) {
  const auto ref = reference_run(c);
  const auto pipe = pipeline_run(c);
  if (pipelined) *pipelined = pipe;
  ASSERT_EQ(pipe.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(pipe.losses[s], ref.losses[s], atol + rtol * std::abs(ref.losses[s])) << "loss of step " << s;
  }
  ASSERT_EQ(pipe.grad_norms.size(), ref.grad_norms.size());
  for (size_t s = 0; s < ref.grad_norms.size(); ++s) {
    if (std::isnan(ref.grad_norms[s])) {
      EXPECT_TRUE(std::isnan(pipe.grad_norms[s])) << "step " << s << " was skipped in one process";
      continue;
    }
    EXPECT_NEAR(pipe.grad_norms[s], ref.grad_norms[s], atol + rtol * ref.grad_norms[s]) << "gradient norm of step " << s;
  }
  auto module = c.module();
  std::map<std::string, int64_t> first_use;
  for (size_t i = 0; i < module.layers.size(); ++i) {
    const auto& key = module.layers[i].tied_key;
    if (!key.empty() && !first_use.count(key)) first_use[key] = static_cast<int64_t>(i);
  }
  size_t compared = 0;
  for (const auto& [name, p] : pipe.params) {
    std::string ref_name = name;
    if (!ref.params.count(name)) {
      const auto dot = name.find('.');
      const auto layer = std::stoll(name.substr(0, dot));
      const auto& key = module.layers[static_cast<size_t>(layer)].tied_key;
      ASSERT_FALSE(key.empty()) << "no reference parameter " << name;
      ref_name = std::to_string(first_use[key]) + name.substr(dot);
    }
    const auto& expected = ref.params.at(ref_name);
    ASSERT_EQ(p.sizes(), expected.sizes()) << name;
    EXPECT_TRUE(torch::allclose(p.cpu(), expected, rtol, atol))
        << name << ": max difference " << (p.cpu() - expected).abs().max().item<double>();
    ++compared;
  }
  EXPECT_GE(compared, ref.params.size()) << "every reference parameter is compared";
}

}  // namespace pipetrain::testing
