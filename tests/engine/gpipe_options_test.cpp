// GPipe's checks (type and message of every error), its module interface and placement rules.
#include <gtest/gtest.h>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/error.h"

namespace pipetrain {
namespace {

// Expects `fn` to throw E whose message contains every fragment.
template <typename E, typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    FAIL() << "no exception";
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << what;
  }
}

TEST(GPipeOptions, BuilderDefaults) {
  GPipeOptions o({1, 2});
  EXPECT_EQ(o.balance(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(o.chunks(), 1);
  EXPECT_EQ(o.checkpoint(), Checkpoint::ExceptLast);
  EXPECT_TRUE(o.devices().empty());
  EXPECT_FALSE(o.deferred_batch_norm());
  o.chunks(4).checkpoint(Checkpoint::Always).deferred_batch_norm(true);
  EXPECT_EQ(o.chunks(), 4);
  EXPECT_EQ(o.checkpoint(), Checkpoint::Always);
  EXPECT_TRUE(o.deferred_batch_norm());
}

TEST(GPipeErrors, DuplicateChildren) {
  torch::nn::Linear shared(2, 2);
  torch::nn::Sequential model(shared, shared);
  expect_error<ModuleError>([&] { (void)GPipe(model, GPipeOptions({1, 1})); },
                            {"same module twice", "'0'", "'1'"});
}

// A layer that multiplies by a weight it is given (here: another layer's).
struct ScaleImpl : torch::nn::Module {
  explicit ScaleImpl(const torch::Tensor& w) { weight = register_parameter("weight", w); }
  torch::Tensor forward(const torch::Tensor& x) { return x.mm(weight); }
  torch::Tensor weight;
};
TORCH_MODULE(Scale);

TEST(GPipeErrors, ParametersSharedBetweenChildren) {
  torch::nn::Linear a(2, 2);
  torch::nn::Sequential model(a, Scale(a->weight));
  expect_error<ModuleError>([&] { (void)GPipe(model, GPipeOptions({1, 1})); },
                            {"parameter 'weight'", "child '1'", "child '0'", "shared"});
}

TEST(GPipeErrors, BalanceSumDiffersFromLayers) {
  expect_error<BalanceError>([] { (void)GPipe(testing::mlp6(), GPipeOptions({3, 2})); },
                             {"6 layers", "[3, 2]", "sums to 5", "balance_by_time"});
  expect_error<ConfigError>([] { (void)GPipe(testing::mlp6(), GPipeOptions({4, 4})); },
                            {"module: 6, sum of balance: 8"});
}

TEST(GPipeErrors, BalanceEntryNotPositive) {
  expect_error<BalanceError>([] { (void)GPipe(testing::mlp6(), GPipeOptions({7, 0, -1})); },
                             {"positive", "[7, 0, -1]"});
}

TEST(GPipeErrors, MorePartitionsThanDevices) {
  expect_error<DeviceError>(
      [] { (void)GPipe(testing::mlp6(), GPipeOptions({3, 3}).devices({torch::kCPU})); },
      {"devices: 1, partitions: 2", "GPipeOptions::devices"});
}

TEST(GPipeErrors, ChunksNotPositive) {
  for (int64_t chunks : {0, -3}) {
    expect_error<ConfigError>([&] { (void)GPipe(testing::mlp6(), GPipeOptions({6}).chunks(chunks)); },
                              {"chunks", std::to_string(chunks)});
  }
}

TEST(GPipePlacement, ExtraDevicesAreDropped) {
  GPipe gpipe(testing::mlp6(),
              GPipeOptions({3, 3}).devices({torch::kCPU, torch::kCPU, torch::kCPU}));
  EXPECT_EQ(gpipe->devices().size(), 2u);
  EXPECT_EQ(gpipe->num_partitions(), 2);
}

TEST(GPipePlacement, DefaultIsTheCpuForEveryPartitionWithoutCuda) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA present: the default is every GPU";
  GPipe gpipe(testing::mlp6(), GPipeOptions({2, 2, 2}));
  ASSERT_EQ(gpipe->devices().size(), 3u);
  for (const auto& d : gpipe->devices()) EXPECT_TRUE(d.is_cpu());
}

TEST(GPipePlacement, MovingIsRefusedButCastingIsAllowed) {
  GPipe gpipe(testing::mlp6(), GPipeOptions({3, 3}));
  expect_error<DeviceError>([&] { gpipe->to(torch::kCPU); }, {"manages device placement"});
  expect_error<DeviceError>([&] { gpipe->to(torch::Device(torch::kCPU), torch::kDouble); },
                            {"GPipeOptions::devices"});
  gpipe->to(torch::kDouble);
  for (const auto& p : gpipe->parameters()) EXPECT_EQ(p.scalar_type(), torch::kDouble);
  const auto out = gpipe->forward(torch::randn({4, 8}, torch::kDouble));
  EXPECT_EQ(out.scalar_type(), torch::kDouble);
}

TEST(GPipeModule, SizeIndexingAndIteration) {
  auto model = testing::mlp6();
  GPipe gpipe(model, GPipeOptions({2, 4}).chunks(2));
  EXPECT_EQ(gpipe->size(), 6);
  EXPECT_EQ(gpipe->balance(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(gpipe->chunks(), 2);
  EXPECT_EQ(gpipe->checkpoint(), Checkpoint::ExceptLast);
  for (int64_t k = 0; k < 6; ++k) {
    EXPECT_EQ((*gpipe)[k].get(), model[k].get()) << k;  // the original layers, not copies
    EXPECT_EQ((*gpipe)[k - 6].get(), model[k].get()) << k - 6;
  }
  EXPECT_THROW((*gpipe)[6], c10::IndexError);
  EXPECT_THROW((*gpipe)[-7], c10::IndexError);
  size_t k = 0;
  for (const auto& layer : *gpipe) EXPECT_EQ(layer.get(), model[k++].get());
  EXPECT_EQ(k, 6u);
  EXPECT_EQ(gpipe->partition(0)->size(), 2u);
  EXPECT_EQ(gpipe->partition(1)->size(), 4u);
  // Parameters are named by partition, then by the layer's name in the model.
  EXPECT_TRUE(gpipe->named_parameters().contains("partitions.1.2.weight"));
}

TEST(GPipeModule, PrettyPrint) {
  GPipe gpipe(testing::mlp6(), GPipeOptions({3, 3}).chunks(4));
  std::ostringstream out;
  out << *gpipe;
  EXPECT_NE(out.str().find("GPipe(balance=[3, 3], chunks=4, checkpoint=except_last)"),
            std::string::npos)
      << out.str();
}

}  // namespace
}  // namespace pipetrain
