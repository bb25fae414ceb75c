// WORKLOADS.md's "mlp": the model, its initialisation stream and its data.
#include "apps/bench/mlp_workload.h"

#include "apps/data/mlp_workload.h"

#include "pipetrain/error.h"

namespace pipetrain::apps {

namespace {

torch::nn::Linear linear_from(const torch::Tensor& w, const torch::Tensor& b) {
  torch::nn::Linear layer(MlpWorkload::kWidth, MlpWorkload::kWidth);
  torch::NoGradGuard no_grad;
  layer->weight.copy_(w);
  layer->bias.copy_(b);
  return layer;
}

}  // namespace

MlpWorkload make_mlp_workload(const std::string& name) {
  MlpWorkload w;
  w.name = name;
  if (name == "mlp") {
    w.stages = 2;
  } else if (name == "mlp-4") {
    w.stages = 4;
  } else {
    throw ConfigError("unknown workload \"" + name + "\"; use mlp or mlp-4 (shared/bench/WORKLOADS.md)");
  }
  // The one copy of WORKLOADS.md's generator stream (shared with the "mlp" example).
  const auto& drawn = data::mlp_workload();
  w.weights = drawn.weights;
  w.biases = drawn.biases;
  w.x = drawn.x;
  w.y = drawn.y;
  return w;
}

PipelineModule mlp_pipeline_module(const MlpWorkload& workload) {
  PipelineModule module;
  for (int i = 0; i < MlpWorkload::kLinears; ++i) {
    const auto w = workload.weights[static_cast<size_t>(i)];
    const auto b = workload.biases[static_cast<size_t>(i)];
    module.layers.push_back(LayerSpec::make("Linear(1024, 1024)", "Linear",
                                            [w, b] { return torch::nn::AnyModule(linear_from(w, b)); }));
    module.layers.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  }
  module.loss = [](const Batch& out, const Batch& labels) { return torch::mse_loss(out.tensor(), labels.tensor()); };
  return module;
}

torch::nn::Sequential mlp_sequential(const MlpWorkload& workload) {
  torch::nn::Sequential model;
  for (int i = 0; i < MlpWorkload::kLinears; ++i) {
    model->push_back(linear_from(workload.weights[static_cast<size_t>(i)], workload.biases[static_cast<size_t>(i)]));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

}  // namespace pipetrain::apps
