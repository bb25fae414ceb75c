// A tied key's tied_params (DeepSpeed's tied_weight_attr) name parameters its module has, the
// same on every use; else the engine refuses at construction, naming the key and the fix.
// (Training with a subset tied: tests/python/test_tied_weight_attr.py, against the oracle.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/engine_models.h"
#include "engine/engine_oracle.h"

namespace pipetrain::testing {
namespace {

std::string tied_construction_error(PipelineModule module) {
  auto hub = comm::InProcessHub::create(1);
  module.num_stages = 1;
  try {
    PipelineEngine engine(std::move(module), oracle_config(2, "1f1b"), hub->endpoint(0));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(EngineTiedParams, NamesMustBeParametersOfTheModule) {
  auto m = tied_mlp(5, 12, 1);
  m.layers.front().tied_params = {"weight", "scale"};
  m.layers.back().tied_params = {"weight", "scale"};
  EXPECT_THAT(tied_construction_error(std::move(m)),
              ::testing::AllOf(::testing::HasSubstr("tied key 'proj' ties parameter 'scale'"),
                               ::testing::HasSubstr("[weight, bias]")));
}

TEST(EngineTiedParams, EveryUseNamesTheSameParameters) {
  auto m = tied_mlp(5, 12, 1);
  m.layers.front().tied_params = {"weight"};
  EXPECT_THAT(tied_construction_error(std::move(m)), ::testing::HasSubstr("names its tied parameters twice, differently"));
}

TEST(EngineTiedParams, ASubsetThatExistsIsAccepted) {
  auto m = tied_mlp(5, 12, 1);
  m.layers.front().tied_params = {"weight"};
  m.layers.back().tied_params = {"weight"};
  EXPECT_EQ(tied_construction_error(std::move(m)), "");
}

}  // namespace
}  // namespace pipetrain::testing
