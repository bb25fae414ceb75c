// Layer specs build only the requested range, and tied specs share one module.
#include "pipetrain/partition/layer_spec.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

std::vector<LayerSpec> tied_model() {
  auto embedding = [] { return torch::nn::AnyModule(torch::nn::Embedding(10, 4)); };
  return {
      LayerSpec::tied_layer("embed", "Embedding(10, 4)", "Embedding", embedding),
      LayerSpec::of<torch::nn::ReLU>("ReLU"),
      LayerSpec::tied_layer("embed", "Projection", "Embedding", embedding,
                            [](torch::nn::AnyModule& m, const Batch& x) {
                              auto weight = m.get<torch::nn::Embedding>()->weight;
                              return Batch(torch::matmul(x.tensor(), weight.t()));
                            }),
  };
}

TEST(LayerSpec, BuildsOnlyTheRange) {
  std::vector<LayerSpec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 3, 3));
  auto built = build_layers(specs, 1, 3);
  EXPECT_EQ(built.modules.size(), 2u);
  EXPECT_EQ(built.begin, 1);
  EXPECT_EQ(built.parameters().size(), 4u);
  EXPECT_THROW(build_layers(specs, 2, 5), ConfigError);
}

TEST(LayerSpec, TiedUsesShareOneModule) {
  auto built = build_layers(tied_model(), 0, 3);
  EXPECT_EQ(built.modules[0].ptr().get(), built.modules[2].ptr().get());
  EXPECT_EQ(built.parameters().size(), 1u);
  auto ids = torch::tensor({1, 2, 3});
  auto out = built.forward(Batch(ids)).tensor();
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 10}));
  auto weight = built.modules[0].get<torch::nn::Embedding>()->weight;
  EXPECT_TRUE(torch::allclose(out, torch::matmul(torch::relu(weight.index({ids})), weight.t())));
}

TEST(LayerSpec, SeedingPerLayerMakesWeightsIndependentOfTheRange) {
  std::vector<LayerSpec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 4, 4));
  auto seed = [](int64_t i) { torch::manual_seed(100 + i); };
  auto whole = build_layers(specs, 0, 3, seed);
  auto tail = build_layers(specs, 2, 3, seed);
  EXPECT_TRUE(torch::equal(whole.modules[2].get<torch::nn::Linear>()->weight,
                           tail.modules[0].get<torch::nn::Linear>()->weight));
}

}  // namespace
}  // namespace pipetrain
