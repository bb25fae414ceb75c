// DeepSpeed pipeline checkpoints (written by tests/fixtures/deepspeed/make_fixtures.py with
// PyTorch) load into one process and into each rank of a pipeline with the exact tensors saved.
#include "pipetrain/engine/deepspeed_import.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/checkpoint_support.h"
#include "engine/engine_models.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/error.h"

namespace pipetrain::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kFixtures = fs::path(PIPETRAIN_SOURCE_DIR) / "tests" / "fixtures" / "deepspeed";

// The fixtures' model, as the DeepSpeed PipelineModule built it. `first` replaces layer 0.
PipelineModule ds_mlp(LayerSpec first = LayerSpec::of<torch::nn::Linear>("Linear", 5, 8)) {
  PipelineModule m;
  m.layers.push_back(std::move(first));
  m.layers.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 8, 8));
  m.layers.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 8, 3));
  m.loss = mse;
  return m;
}

BuiltLayers build(const PipelineModule& m) {
  return build_layers(m.layers, 0, static_cast<int64_t>(m.layers.size()));
}

const json& expected() {
  static const json j = [] {
    std::ifstream in(kFixtures / "expected.json");
    return json::parse(in);
  }();
  return j;
}

// The fixture's tensor, as float32 (its values are bf16/fp16 ones where it was saved so).
torch::Tensor expected_tensor(const std::string& fixture, int64_t layer, const std::string& name) {
  const auto& e = expected().at(fixture).at(std::to_string(layer)).at(name);
  const auto values = e.at("values").get<std::vector<float>>();
  return torch::tensor(values).reshape(e.at("shape").get<std::vector<int64_t>>());
}

// Every tensor of the fixture equals the module's, bit for bit.
void expect_layers_equal(const std::string& fixture, const BuiltLayers& layers) {
  for (const auto& [layer, params] : expected().at(fixture).items()) {
    const auto& module = *layers.modules.at(std::stoul(layer)).ptr();
    const auto named = module.named_parameters();
    for (const auto& [name, e] : params.items()) {
      const auto& actual = named[name];
      EXPECT_EQ(actual.scalar_type(), torch::kFloat32) << layer << "." << name;
      EXPECT_TRUE(torch::equal(actual, expected_tensor(fixture, std::stoll(layer), name))) << layer << "." << name;
    }
  }
}

template <typename F>
std::string checkpoint_error(F&& load) {
  try {
    load();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no CheckpointError";
  return "";
}

class DeepSpeedImport : public CheckpointDirTest {
 protected:
  // A copy of a fixture's tag directory to break.
  fs::path copy_tag(const std::string& fixture, const std::string& tag) {
    const auto out = dir_ / tag;
    fs::create_directories(dir_);
    fs::copy(kFixtures / fixture / tag, out);
    return out;
  }
};

TEST_F(DeepSpeedImport, LoadsEveryLayerIntoOneProcessThroughLatest) {
  auto layers = build(ds_mlp());
  const auto tag_dir = load_deepspeed_checkpoint(layers, (kFixtures / "mlp").string());
  EXPECT_EQ(fs::path(tag_dir).filename(), "global_step100");
  expect_layers_equal("mlp", layers);
}

TEST_F(DeepSpeedImport, LoadsATagDirectoryNamedDirectly) {
  auto layers = build(ds_mlp());
  load_deepspeed_checkpoint(layers, (kFixtures / "mlp" / "global_step100").string());
  expect_layers_equal("mlp", layers);
}

TEST_F(DeepSpeedImport, ConvertsHalfAndBFloat16ToTheModulesFloat) {
  auto layers = build(ds_mlp());
  ASSERT_EQ(expected().at("mlp_half").at("0").at("weight").at("dtype"), "torch.bfloat16");
  ASSERT_EQ(expected().at("mlp_half").at("2").at("weight").at("dtype"), "torch.float16");
  load_deepspeed_checkpoint(layers, (kFixtures / "mlp_half").string());
  expect_layers_equal("mlp_half", layers);
}

TEST_F(DeepSpeedImport, EachRankOfAPipelineLoadsItsOwnLayers) {
  std::mutex mutex;
  std::map<int, std::set<int64_t>> layers_of_stage;
  run_pipeline(2, ckpt_config(2), [] { return ds_mlp(); }, [&](PipelineEngine& engine) {
    load_deepspeed_checkpoint(engine, (kFixtures / "mlp").string());
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [key, p] : engine.named_parameters()) {
      const auto dot = key.find('.');
      const int64_t layer = std::stoll(key.substr(0, dot));
      EXPECT_TRUE(torch::equal(p, expected_tensor("mlp", layer, key.substr(dot + 1)))) << key;
      layers_of_stage[engine.stage()].insert(layer);
    }
  });
  EXPECT_EQ(layers_of_stage[0], (std::set<int64_t>{0}));
  EXPECT_EQ(layers_of_stage[1], (std::set<int64_t>{2, 3}));
}

TEST_F(DeepSpeedImport, AMissingLayerFileNamesIt) {
  const auto tag = copy_tag("mlp", "global_step100");
  fs::remove(tag / "layer_02-model_states.pt");
  auto layers = build(ds_mlp());
  const auto message = checkpoint_error([&] { load_deepspeed_checkpoint(layers, tag.string()); });
  EXPECT_NE(message.find("layer_02-model_states.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("layer 2"), std::string::npos) << message;
}

TEST_F(DeepSpeedImport, AMisspeltKeyNamesTheFileAndBothKeys) {
  auto layers = build(ds_mlp());
  const auto message =
      checkpoint_error([&] { load_deepspeed_checkpoint(layers, (kFixtures / "bad_keys" / "global_step1").string()); });
  EXPECT_NE(message.find("layer_00-model_states.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("\"bias\""), std::string::npos) << message;
  EXPECT_NE(message.find("bais"), std::string::npos) << message;
}

TEST_F(DeepSpeedImport, AKeyTheLayerLacksNamesTheFileAndTheKey) {
  auto layers = build(ds_mlp(LayerSpec::make("Linear(5, 8, bias=false)", "Linear", [] {
    return torch::nn::AnyModule(torch::nn::Linear(torch::nn::LinearOptions(5, 8).bias(false)));
  })));
  const auto message = checkpoint_error([&] { load_deepspeed_checkpoint(layers, (kFixtures / "mlp").string()); });
  EXPECT_NE(message.find("layer_00-model_states.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("holds \"bias\""), std::string::npos) << message;
}

TEST_F(DeepSpeedImport, AnotherShapeNamesTheFileTheKeyAndBothShapes) {
  auto layers = build(ds_mlp(LayerSpec::of<torch::nn::Linear>("Linear", 5, 9)));
  const auto before = layers.modules[0].ptr()->named_parameters()["weight"].clone();
  const auto message = checkpoint_error([&] { load_deepspeed_checkpoint(layers, (kFixtures / "mlp").string()); });
  EXPECT_NE(message.find("layer_00-model_states.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("\"bias\" has shape [8] in the file but [9]"), std::string::npos) << message;
  EXPECT_TRUE(torch::equal(layers.modules[0].ptr()->named_parameters()["weight"], before));
}

TEST_F(DeepSpeedImport, ADirectoryWithoutLayersOrLatestIsAnError) {
  fs::create_directories(dir_);
  auto layers = build(ds_mlp());
  const auto message = checkpoint_error([&] { load_deepspeed_checkpoint(layers, dir_.string()); });
  EXPECT_NE(message.find(dir_.string()), std::string::npos) << message;
  EXPECT_NE(message.find("latest"), std::string::npos) << message;
}

TEST_F(DeepSpeedImport, ConvertsToAPipetrainCheckpointThatAnyLayoutLoads) {
  const auto out = (dir_ / "converted").string();
  fs::create_directories(dir_);
  convert_deepspeed_checkpoint(ds_mlp(), (kFixtures / "mlp_half").string(), out, ckpt_config(2));
  EXPECT_EQ(checkpoint_step(out), 0);

  auto layers = build(ds_mlp());
  EXPECT_EQ(load_checkpoint(layers, out), 0);
  expect_layers_equal("mlp_half", layers);

  std::mutex mutex;
  size_t compared = 0;
  run_pipeline(2, ckpt_config(2), [] { return ds_mlp(); }, [&](PipelineEngine& engine) {
    load_checkpoint(engine, out);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [key, p] : engine.named_parameters()) {
      const auto dot = key.find('.');
      EXPECT_TRUE(torch::equal(p, expected_tensor("mlp_half", std::stoll(key.substr(0, dot)), key.substr(dot + 1))))
          << key;
      ++compared;
    }
  });
  EXPECT_EQ(compared, 6u);
}

}  // namespace
}  // namespace pipetrain::testing
