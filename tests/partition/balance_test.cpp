// Automatic balancing: costs by parameters, type, size and time, and their balances.
#include "pipetrain/partition/balance.h"

#include <gtest/gtest.h>

#include <thread>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

// A layer whose forward takes a fixed time: a timing cost that a loaded machine cannot hide.
struct SleepImpl : torch::nn::Module {
  explicit SleepImpl(int ms) : ms(ms) {}
  torch::Tensor forward(torch::Tensor x) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return x * 1.0;
  }
  int ms;
};
TORCH_MODULE(Sleep);

TEST(Balance, Uniform) {
  EXPECT_EQ(balance_uniform(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(balance_uniform(4, 4), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_THROW(balance_uniform(2, 3), ConfigError);
}

TEST(Balance, ByParameters) {
  torch::nn::Sequential model(torch::nn::Linear(10, 10), torch::nn::ReLU(), torch::nn::Linear(10, 10),
                              torch::nn::ReLU(), torch::nn::Linear(10, 100), torch::nn::Linear(100, 10));
  EXPECT_EQ(parameter_costs(model), (std::vector<double>{110, 0, 110, 0, 1100, 1010}));
  EXPECT_EQ(balance_by_params(2, model), (std::vector<int64_t>{5, 1}));
}

TEST(Balance, ByParametersOfSpecsCountsTiedModulesOnce) {
  auto embed = [] { return torch::nn::AnyModule(torch::nn::Embedding(100, 8)); };
  std::vector<LayerSpec> specs{LayerSpec::tied_layer("e", "Embedding", "Embedding", embed),
                               LayerSpec::of<torch::nn::Linear>("Linear", 8, 8),
                               LayerSpec::tied_layer("e", "Embedding", "Embedding", embed)};
  EXPECT_EQ(parameter_costs(specs), (std::vector<double>{800, 72, 0}));
}

TEST(Balance, ByTypeRegex) {
  std::vector<LayerSpec> specs;
  for (int i = 0; i < 4; ++i) {
    specs.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 4, 4));
    specs.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  }
  EXPECT_EQ(type_costs(specs, "^linear$"), (std::vector<double>{1, 0, 1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(min_max_partition(type_costs(specs, "linear"), 2), (std::vector<int64_t>{3, 5}));
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::ReLU());
  EXPECT_EQ(type_costs(model, "ReLU"), (std::vector<double>{0, 1}));
  try {
    type_costs(specs, "Conv2d");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Linear, ReLU"), std::string::npos) << e.what();
  }
  EXPECT_THROW(type_costs(specs, "(unclosed"), ConfigError);
}

TEST(Balance, BySizeCountsParametersAndActivations) {
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU());
  const auto costs = size_costs(model, Batch(torch::ones({3, 4})), /*param_scale=*/2.0);
  EXPECT_EQ(costs, (std::vector<double>{2.0 * 40 * 4 + 3 * 8 * 4, 3 * 8 * 4}));
}

TEST(Balance, ByTimeGivesAHeavyLayerItsOwnStage) {
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) model->push_back(Sleep(i == 3 ? 20 : 2));
  TimeProfileOptions options;
  options.budget = std::chrono::milliseconds(200);
  const auto costs = time_costs(model, Batch(torch::ones({2, 2})), options);
  EXPECT_GT(costs[3], 5 * costs[0]);
  EXPECT_EQ(balance_by_time(3, model, Batch(torch::ones({2, 2})), options),
            (std::vector<int64_t>{3, 1, 4}));
}

}  // namespace
}  // namespace pipetrain
