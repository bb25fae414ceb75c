// The benchmark workload "mlp" of bench/WORKLOADS.md: its initial weights and its data.
#include "apps/data/mlp_workload.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

namespace pipetrain::data {
namespace {

MlpWorkload generate() {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
  }
  MlpWorkload w;
  torch::manual_seed(0);
  for (int64_t i = 0; i < kMlpLinears; ++i) {
    torch::nn::Linear linear(kMlpWidth, kMlpWidth);
    torch::nn::ReLU relu;  // draws nothing; constructed to follow the documented order
    w.weights.push_back(linear->weight.detach());
    w.biases.push_back(linear->bias.detach());
  }
  w.x = torch::randn({kMlpRows, kMlpWidth});
  w.y = torch::randn({kMlpRows, kMlpWidth});
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
  }
  return w;
}

}  // namespace

const MlpWorkload& mlp_workload() {
  static const MlpWorkload workload = generate();
  return workload;
}

}  // namespace pipetrain::data
