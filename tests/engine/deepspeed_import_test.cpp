// DeepSpeed pipeline checkpoints (written by tests/fixtures/deepspeed/make_fixtures.py with
// PyTorch) load into one process and into each rank of a pipeline with the exact tensors saved.
#include "pipetrain/engine/deepspeed_import.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
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

// A user's own torch.save(layer.state_dict()): the dict's _metadata (a BUILD) and, with
// keep_vars=True, nn.Parameter values (_rebuild_parameter).
TEST_F(DeepSpeedImport, ReadsStateDictsWithMetadataAndParameters) {
  auto layers = build(ds_mlp());
  load_deepspeed_checkpoint(layers, (kFixtures / "as_saved").string());
  expect_layers_equal("as_saved", layers);
  const auto file = kFixtures / "as_saved" / "global_step3" / "layer_00-model_states.pt";
  const auto entries = read_deepspeed_layer(file.string());
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].first, "weight");
  EXPECT_EQ(entries[1].first, "bias");
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

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A damaged file and a hostile pickle (fuzzing): the file cut at every length and each of its bytes
// flipped, and its data.pkl cut at every length and each of its bytes set to ten values inside a
// well-formed zip, so that the unpickler itself meets the damage (LibTorch 1.13's own unpickler
// crashed on the third such pickle). Each read is a state dict or a CheckpointError naming the
// file: never another exception, never a crash.
TEST_F(DeepSpeedImport, DamagedFilesAndHostilePicklesAreCheckpointErrors) {
  const auto source = kFixtures / "mlp" / "global_step100" / "layer_02-model_states.pt";
  const std::string bytes = read_bytes(source);
  fs::create_directories(dir_);
  const auto path = dir_ / "layer_02-model_states.pt";
  int refused = 0;
  int read = 0;
  auto attempt = [&](const std::string& label) {
    try {
      read_deepspeed_layer(path.string());
      ++read;
    } catch (const CheckpointError& e) {
      ++refused;
      if (std::string(e.what()).find(path.string()) == std::string::npos) {
        ADD_FAILURE() << label << ": the error does not name the file: " << e.what();
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << label << ": " << typeid(e).name() << ": " << e.what();
    }
  };
  for (size_t n = 0; n < bytes.size() && !HasFailure(); ++n) {
    write_bytes(path, bytes.substr(0, n));
    attempt(fmt::format("cut to {} bytes", n));
  }
  EXPECT_EQ(refused, static_cast<int>(bytes.size()));
  for (size_t i = 0; i < bytes.size() && !HasFailure(); ++i) {
    auto flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0xff);
    write_bytes(path, flipped);
    attempt(fmt::format("byte {} flipped", i));
  }

  std::map<std::string, std::string> records;
  {
    caffe2::serialize::PyTorchStreamReader reader(source.string());
    for (const auto& name : reader.getAllRecords()) {
      if (name == "version" || name == ".data/version") continue;  // the writer adds its own
      const auto [data, size] = reader.getRecord(name);
      records[name] = std::string(static_cast<const char*>(data.get()), size);
    }
  }
  const std::string pickle = records.at("data.pkl");
  auto rezip = [&](const std::string& pkl) {
    caffe2::serialize::PyTorchStreamWriter writer(path.string());
    for (const auto& [name, data] : records) {
      const auto& record = name == "data.pkl" ? pkl : data;
      writer.writeRecord(name, record.data(), record.size());
    }
    writer.writeEndOfFile();
  };
  rezip(pickle);
  const int read_before = read;
  attempt("the pickle as it was");
  ASSERT_EQ(read, read_before + 1) << "the rewritten zip must read as the original";
  const int refused_before_cuts = refused;
  for (size_t n = 0; n < pickle.size() && !HasFailure(); ++n) {
    rezip(pickle.substr(0, n));
    attempt(fmt::format("data.pkl cut to {} bytes", n));
  }
  EXPECT_EQ(refused - refused_before_cuts, static_cast<int>(pickle.size())) << "a cut pickle has no STOP";
  // Each byte set to 0x00, 0xff, its lowest bit flipped, and to MARK, STOP, REDUCE, SETITEMS,
  // BINGET, BINPUT, TUPLE, EMPTY_DICT and BUILD.
  for (size_t i = 0; i < pickle.size() && !HasFailure(); ++i) {
    const char flipped = static_cast<char>(pickle[i] ^ 1);
    for (const char c : {'\x00', '\xff', flipped, '(', '.', 'R', 'u', 'h', 'q', 't', '}', 'b'}) {
      if (pickle[i] == c) continue;
      auto mutated = pickle;
      mutated[i] = c;
      rezip(mutated);
      attempt(fmt::format("data.pkl byte {} set to 0x{:02x}", i, static_cast<unsigned char>(c)));
    }
  }
  // And three pickles written to harm a reader: containers nested 100000 deep (freeing them would
  // recurse as deep), a call of os.system, and a string longer than the file.
  using namespace std::string_literals;
  const std::string deep = pickle.substr(0, 2) + "N" + std::string(100000, '\x85') + ".";
  const std::string call = pickle.substr(0, 2) + "cposix\nsystem\nX\x04\0\0\0true\x85R."s;
  const std::string long_string = pickle.substr(0, 2) + "X\xff\xff\xff\x7f";
  for (const auto& [label, hostile, expected] :
       {std::tuple<const char*, std::string, const char*>{"nested", deep, "nested more than 64 deep"},
        {"os.system", call, "calls posix.system"},
        {"long string", long_string, "a string of 2147483647 bytes"}}) {
    rezip(hostile);
    try {
      read_deepspeed_layer(path.string());
      ADD_FAILURE() << label << " was read";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << label << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace pipetrain::testing
