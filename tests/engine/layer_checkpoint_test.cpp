// Per-layer checkpoints: written by one layout, read by another (and by one process), with
// corruption and model mismatches reported as CheckpointError.
#include "pipetrain/engine/layer_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/checkpoint_support.h"
#include "engine/engine_models.h"
#include "engine/optimizer_compat.h"
#include "engine/engine_oracle.h"
#include "pipetrain/engine/gpipe.h"

namespace pipetrain::testing {
namespace {

namespace fs = std::filesystem;

class LayerCheckpoint : public CheckpointDirTest {};

std::vector<torch::Tensor> snapshot_parameters(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

bool same_values(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& values) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (!torch::equal(params[i], values[i])) return false;
  }
  return params.size() == values.size();
}

void assign(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
}

TEST_F(LayerCheckpoint, ResumesUnderAnotherLayoutAndInOneProcess) {
  auto make = [] { return tied_mlp(5, 12, 3); };
  const auto ckpt = (dir_ / "ckpt").string();
  std::map<std::string, torch::Tensor> saved;
  std::mutex mutex;
  run_pipeline(2, ckpt_config(2), make, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    save_checkpoint(engine, ckpt, R"({"example": "test"})");
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, p] : engine.named_parameters()) saved[name] = p.detach().clone();
  });
  EXPECT_EQ(checkpoint_step(ckpt), 2);
  EXPECT_FALSE(fs::exists(ckpt + ".partial"));

  // Three stages with another seed: every layer comes from the files, tied copies included.
  std::map<std::string, torch::Tensor> loaded;
  auto config = ckpt_config(3);
  config.seed = 7;
  run_pipeline(3, config, make, [&](PipelineEngine& engine) {
    EXPECT_EQ(load_checkpoint(engine, ckpt), 2);
    EXPECT_EQ(engine.global_steps(), 2);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, p] : engine.named_parameters()) loaded[name] = p.detach().clone();
  });
  size_t compared = 0;
  for (const auto& [name, p] : loaded) {
    if (!saved.count(name)) continue;  // a tied later use: checked through the one process below
    EXPECT_TRUE(torch::equal(p, saved.at(name))) << name;
    ++compared;
  }
  EXPECT_GE(compared, saved.size() - 1);

  auto module = make();
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 5);
  EXPECT_EQ(load_checkpoint(built, ckpt), 2);
  const auto all = named_by_first_use(built);
  for (const auto& [name, p] : saved) {
    if (all.count(name)) {
      EXPECT_TRUE(torch::equal(p, all.at(name))) << name;
    }
  }
}

TEST_F(LayerCheckpoint, OptimizerStateMakesResumeExactUnderAnyLayout) {
  // Adam: without its moments a resumed run would take different steps.
  auto make = [] { return mlp(5, 12, 5, 4); };
  auto config = [](int stages) {
    auto c = ckpt_config(stages);
    c.optimizer.type = "Adam";
    c.optimizer.lr = 0.01;
    return c;
  };
  const auto ckpt = (dir_ / "ckpt").string();
  std::vector<double> straight;
  std::map<std::string, torch::Tensor> final_params;
  std::mutex mutex;
  run_pipeline(2, config(2), make, [&](PipelineEngine& engine) {
    train_steps(engine, 3, 0);
    save_checkpoint(engine, ckpt);
    const auto losses = train_steps(engine, 3, 3);
    std::lock_guard<std::mutex> lock(mutex);
    straight = losses;
    for (const auto& [name, p] : engine.named_parameters()) final_params[name] = p.detach().clone();
  });
  ASSERT_TRUE(fs::exists(ckpt + "/layer_00000-optim.pt"));

  // Same layout: bit-exact losses and parameters.
  run_pipeline(2, config(2), make, [&](PipelineEngine& engine) {
    EXPECT_EQ(load_checkpoint(engine, ckpt), 3);
    const auto losses = train_steps(engine, 3, 3);
    EXPECT_EQ(losses, straight);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, p] : engine.named_parameters()) EXPECT_TRUE(torch::equal(p, final_params.at(name))) << name;
  });
  // Another layout: the same run up to float summation order.
  run_pipeline(3, config(3), make, [&](PipelineEngine& engine) {
    load_checkpoint(engine, ckpt);
    const auto losses = train_steps(engine, 3, 3);
    ASSERT_EQ(losses.size(), straight.size());
    for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], straight[i], 1e-5 * std::abs(straight[i]));
  });
  // Without the optimizer state the run differs: the test can tell.
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    if (entry.path().filename().string().find("-optim.pt") != std::string::npos) fs::remove(entry.path());
  }
  {
    std::ifstream in(ckpt + "/manifest.json");
    auto manifest = nlohmann::json::parse(in);
    for (auto& [key, file] : manifest["files"].items()) file.erase("optim");
    std::ofstream(ckpt + "/manifest.json") << manifest.dump();
  }
  run_pipeline(2, config(2), make, [&](PipelineEngine& engine) {
    load_checkpoint(engine, ckpt);
    EXPECT_NE(train_steps(engine, 3, 3), straight);
  });
}

TEST_F(LayerCheckpoint, FourStagesContinueInOneProcessGPipeWithTheirAdamState) {
  auto make = [] { return mlp(5, 12, 5, 4); };  // 7 layers
  auto config = ckpt_config(4);
  config.optimizer.type = "Adam";
  config.optimizer.lr = 0.01;
  const auto ckpt = (dir_ / "ckpt").string();
  std::vector<double> straight;
  std::mutex mutex;
  run_pipeline(4, config, make, [&](PipelineEngine& engine) {
    train_steps(engine, 3, 0);
    save_checkpoint(engine, ckpt);
    const auto losses = train_steps(engine, 3, 3);
    std::lock_guard<std::mutex> lock(mutex);
    straight = losses;
  });
  auto module = make();
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 1);
  torch::nn::Sequential sequential;
  for (size_t i = 0; i < built.modules.size(); ++i) sequential->push_back(std::to_string(i), built.modules[i]);
  GPipe gpipe(sequential, GPipeOptions({4, 3}).chunks(4).checkpoint(Checkpoint::Never));
  torch::optim::Adam adam(gpipe->parameters(), torch::optim::AdamOptions(0.01));
  EXPECT_EQ(load_checkpoint(built, ckpt, &adam, "Adam"), 3);
  for (int64_t step = 3; step < 6; ++step) {
    std::vector<torch::Tensor> xs, ys;
    for (int i = 0; i < 4; ++i) {
      const auto mb = mlp_batch(step, 0, i, 4, 5, 5);
      xs.push_back(mb.inputs.tensor());
      ys.push_back(mb.labels.tensor());
    }
    // Equal micro-batches: the mean over all rows is the engine's mean of micro-batch means.
    adam.zero_grad();
    auto loss = torch::mse_loss(gpipe->forward(torch::cat(xs)), torch::cat(ys));
    loss.backward();
    adam.step();
    EXPECT_NEAR(loss.item<double>(), straight[static_cast<size_t>(step - 3)], 1e-5 * straight[0]) << "step " << step;
  }
}

TEST_F(LayerCheckpoint, FourStagesResumeAsTwoStagesTimesTwoReplicas) {
  auto make = [] { return mlp(5, 12, 5, 4); };
  auto config = ckpt_config(4);
  config.optimizer.type = "Adam";
  config.optimizer.lr = 0.01;
  const auto ckpt = (dir_ / "ckpt").string();
  std::vector<double> straight;
  std::mutex mutex;
  run_pipeline(4, config, make, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    save_checkpoint(engine, ckpt);
    const auto losses = train_steps(engine, 2, 2);
    std::lock_guard<std::mutex> lock(mutex);
    straight = losses;
  });
  // 2 stages x 2 replicas over the same 4 ranks: each replica takes half of every step's
  // micro-batches, so the step sees the same batch.
  auto wide = ckpt_config(2);
  wide.optimizer = config.optimizer;
  wide.gradient_accumulation_steps = 2;
  run_pipeline(4, wide, make, [&](PipelineEngine& engine) {
    ASSERT_EQ(engine.num_replicas(), 2);
    EXPECT_EQ(load_checkpoint(engine, ckpt), 2);
    for (int64_t step = 2; step < 4; ++step) {
      int i = 0;
      FunctionIterator it([&]() -> std::optional<MicroBatch> {
        if (i >= engine.micro_batches()) return std::nullopt;
        return mlp_batch(step, 0, engine.replica() * 2 + i++, 4, 5, 5);
      });
      const double loss = engine.train_batch(it);
      EXPECT_NEAR(loss, straight[static_cast<size_t>(step - 2)], 1e-5 * straight[0]) << "step " << step;
    }
  });
}

TEST_F(LayerCheckpoint, OneProcessLoadsOptimizerStateAndRefusesAnotherType) {
  auto make = [] { return mlp(5, 8, 5, 3); };
  auto config = ckpt_config(2);
  config.optimizer.type = "Adam";
  const auto ckpt = (dir_ / "ckpt").string();
  run_pipeline(2, config, make, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    save_checkpoint(engine, ckpt);
  });
  auto module = make();
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 1);
  torch::optim::Adam adam(built.parameters(), torch::optim::AdamOptions(0.01));
  load_checkpoint(built, ckpt, &adam, "Adam");
  ASSERT_EQ(adam.state().size(), built.parameters().size());
  for (const auto& p : built.parameters()) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(
        *adam.state().at(detail::optimizer_state_key(p)));
    EXPECT_EQ(state.step(), 2);
    EXPECT_GT(state.exp_avg_sq().sum().item<double>(), 0.0);
  }
  torch::optim::SGD sgd(built.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  try {
    load_checkpoint(built, ckpt, &sgd, "SGD");
    ADD_FAILURE() << "loaded Adam state into SGD";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds Adam optimizer state but this run's optimizer is SGD"),
              std::string::npos)
        << e.what();
  }
}

// An mlp with a dropout layer: its masks come from the process's default generator.
PipelineModule dropout_mlp() {
  auto m = mlp(5, 8, 5, 3);
  m.layers.insert(m.layers.begin() + 2, LayerSpec::of<torch::nn::Dropout>("Dropout", 0.5));
  return m;
}

TEST_F(LayerCheckpoint, SameLayoutResumeContinuesTheRandomStream) {
  const auto ckpt = (dir_ / "ckpt").string();
  const auto config = ckpt_config(1);
  std::vector<double> uninterrupted, resumed, without_rng;
  run_pipeline(1, config, dropout_mlp, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    save_checkpoint(engine, ckpt);
    uninterrupted = train_steps(engine, 2, 2);
  });
  std::ifstream in(ckpt + "/manifest.json");
  auto manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest["samples"], 2 * 16);
  EXPECT_EQ(manifest["config"]["pipeline"]["schedule"], "1f1b");
  EXPECT_EQ(manifest["rng"]["ranks"], 1);
  EXPECT_TRUE(fs::exists(ckpt + "/rng_rank_00000.pt"));

  torch::manual_seed(12345);  // whatever the process drew in between
  run_pipeline(1, config, dropout_mlp, [&](PipelineEngine& engine) {
    EXPECT_EQ(load_checkpoint(engine, ckpt), 2);
    resumed = train_steps(engine, 2, 2);
  });
  EXPECT_EQ(resumed, uninterrupted) << "bit-exact: the dropout masks continue";

  // The same checkpoint without its RNG state: other masks, other losses.
  manifest.erase("rng");
  std::ofstream(ckpt + "/manifest.json") << manifest.dump();
  torch::manual_seed(12345);
  run_pipeline(1, config, dropout_mlp, [&](PipelineEngine& engine) {
    load_checkpoint(engine, ckpt);
    without_rng = train_steps(engine, 2, 2);
  });
  EXPECT_NE(without_rng, uninterrupted);
}

TEST_F(LayerCheckpoint, TaggedCheckpointsAndTheLatestPointer) {
  const auto dir = dir_.string();
  auto make = [] { return mlp(5, 8, 5, 3); };
  run_pipeline(2, ckpt_config(2), make, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    EXPECT_EQ(save_tagged_checkpoint(engine, dir), "global_step2");
    train_steps(engine, 2, 2);
    EXPECT_EQ(save_tagged_checkpoint(engine, dir), "global_step4");
  });
  EXPECT_EQ(latest_tag(dir), "global_step4");
  EXPECT_EQ(checkpoint_step(dir + "/global_step2"), 2);

  // A crash after the tag's directory is complete but before the pointer moves: latest still
  // names the previous tag, and the new one is loadable by name.
  run_pipeline(1, ckpt_config(1), make, [&](PipelineEngine& engine) {
    load_tagged_checkpoint(engine, dir);
    train_steps(engine, 1, 4);
    set_checkpoint_fault_hook([](const std::string& phase) {
      if (phase == "latest") throw std::runtime_error("crash before the pointer moves");
    });
    EXPECT_THROW(save_tagged_checkpoint(engine, dir), std::runtime_error);
    set_checkpoint_fault_hook({});
  });
  EXPECT_EQ(latest_tag(dir), "global_step4");
  EXPECT_EQ(checkpoint_step(dir + "/global_step5"), 5);
  run_pipeline(2, ckpt_config(2), make, [&](PipelineEngine& engine) {
    EXPECT_EQ(load_tagged_checkpoint(engine, dir), 4);
    EXPECT_EQ(load_tagged_checkpoint(engine, dir, "global_step5"), 5);
  });

  run_pipeline(1, ckpt_config(1), make, [&](PipelineEngine& engine) {
    try {
      load_tagged_checkpoint(engine, (dir_ / "empty").string());
      ADD_FAILURE() << "loaded without a latest pointer";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("has no 'latest' pointer"), std::string::npos) << e.what();
    }
    EXPECT_THROW(load_tagged_checkpoint(engine, dir, "../elsewhere"), CheckpointError);
  });
}

TEST_F(LayerCheckpoint, CorruptionAndMismatchAreCheckpointErrors) {
  auto make = [] { return mlp(5, 8, 5, 3); };
  const auto ckpt = (dir_ / "ckpt").string();
  run_pipeline(2, ckpt_config(2), make, [&](PipelineEngine& engine) { save_checkpoint(engine, ckpt); });

  auto other = mlp(5, 8, 5, 4);  // more layers
  auto built_other = build_seeded_layers(other.layers, 0, static_cast<int64_t>(other.layers.size()), 1);
  try {
    load_checkpoint(built_other, ckpt);
    ADD_FAILURE() << "loaded a checkpoint of another model";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 5 layers but the model has 7"), std::string::npos) << e.what();
  }

  {
    std::fstream f(ckpt + "/layer_00002.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  auto module = make();
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 1);
  try {
    load_checkpoint(built, ckpt);
    ADD_FAILURE() << "loaded a corrupt checkpoint";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("layer_00002.pt is corrupt"), std::string::npos) << e.what();
  }
  // A truncated file (a disk that filled up, a copy cut short) and a truncated manifest.
  fs::resize_file(ckpt + "/layer_00002.pt", 50);
  try {
    load_checkpoint(built, ckpt);
    ADD_FAILURE() << "loaded a truncated layer file";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("layer_00002.pt is corrupt"), std::string::npos) << e.what();
  }
  fs::resize_file(ckpt + "/manifest.json", 20);
  try {
    load_checkpoint(built, ckpt);
    ADD_FAILURE() << "loaded a truncated manifest";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json is not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_checkpoint(built, (dir_ / "missing").string()), CheckpointError);
  EXPECT_EQ(checkpoint_step((dir_ / "missing").string()), -1);
}

// Every field of a manifest removed, or given a value of another type, one at a time (a manifest
// edited by hand, or written by another tool): each load either succeeds (the field is optional)
// or is a CheckpointError, on the one-process path and in an engine. A manifest refused as such
// has loaded nothing.
TEST_F(LayerCheckpoint, AnEditedManifestIsACheckpointErrorBeforeAnythingLoads) {
  using nlohmann::json;
  auto make = [] { return mlp(5, 8, 5, 3); };
  auto config = ckpt_config(1);
  config.optimizer.type = "AdamW";
  const auto ckpt = (dir_ / "ckpt").string();
  run_pipeline(1, config, make, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    save_checkpoint(engine, ckpt);
  });
  const auto manifest_path = ckpt + "/manifest.json";
  json original = json::parse(std::ifstream(manifest_path));
  // Only an fp16 run writes the scaler's state; its fields are edited too.
  original["loss_scaler"] = {{"scale", 1024.0}, {"iteration", 2}, {"last_overflow", -1}, {"hysteresis_left", 2}};
  std::vector<json::json_pointer> pointers;
  std::function<void(const json&, const json::json_pointer&)> walk = [&](const json& j, const json::json_pointer& at) {
    if (!at.empty()) pointers.push_back(at);
    if (j.is_object()) {
      for (const auto& [key, value] : j.items()) walk(value, at / key);
    } else if (j.is_array()) {
      for (size_t i = 0; i < j.size(); ++i) walk(j[i], at / i);
    }
  };
  walk(original, json::json_pointer());
  ASSERT_GT(pointers.size(), 30u);
  const std::vector<std::pair<std::string, json>> replacements = {
      {"a string", "x"}, {"-7", -7}, {"2.5", 2.5}, {"an object", json::object()}, {"an array", json::array()},
      {"null", nullptr}, {"true", true}};
  struct Edit {
    std::string label;
    json manifest;
  };
  std::vector<Edit> edits;
  for (const auto& at : pointers) {
    json removed = original;
    auto& parent = removed[at.parent_pointer()];
    if (parent.is_array()) {
      parent.erase(std::stoul(at.back()));
    } else {
      parent.erase(at.back());
    }
    edits.push_back({at.to_string() + " removed", removed});
    for (const auto& [name, value] : replacements) {
      json edited = original;
      edited[at] = value;
      edits.push_back({at.to_string() + " = " + name, edited});
    }
  }
  auto write = [&](const json& manifest) { std::ofstream(manifest_path) << manifest.dump(2); };
  // Loads `edit` through `load`; notes the edits refused.
  std::set<std::string> refused;
  auto expect_load_or_checkpoint_error = [&](const Edit& edit, const std::function<void()>& load,
                                             const std::function<bool()>& unchanged) {
    write(edit.manifest);
    try {
      load();
    } catch (const CheckpointError& e) {
      refused.insert(edit.label);
      const std::string what = e.what();
      if (what.find("is not a pipetrain checkpoint manifest") != std::string::npos) {
        EXPECT_TRUE(unchanged()) << edit.label << ": refused after loading part of it: " << what;
        EXPECT_NE(what.find("restore the checkpoint directory"), std::string::npos) << what;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << edit.label << ": " << typeid(e).name() << ": " << e.what();
    }
  };
  auto module = make();
  auto built = build_seeded_layers(module.layers, 0, static_cast<int64_t>(module.layers.size()), 7);
  torch::optim::AdamW adamw(built.parameters(), torch::optim::AdamWOptions(0.01));
  const auto fresh = snapshot_parameters(built.parameters());
  for (const auto& edit : edits) {
    assign(built.parameters(), fresh);
    adamw.state().clear();
    expect_load_or_checkpoint_error(
        edit, [&] { load_checkpoint(built, ckpt, &adamw, "AdamW"); },
        [&] { return adamw.state().empty() && same_values(built.parameters(), fresh); });
  }
  const std::set<std::string> refused_one_process = refused;
  refused.clear();
  run_pipeline(1, config, make, [&](PipelineEngine& engine) {
    const auto before = snapshot_parameters(engine.parameters());
    for (const auto& edit : edits) {
      assign(engine.parameters(), before);
      expect_load_or_checkpoint_error(
          edit, [&] { load_checkpoint(engine, ckpt); },
          [&] { return same_values(engine.parameters(), before); });
      if (::testing::Test::HasFailure()) break;
    }
  });
  // Both paths refuse what breaks a field they read, and load despite edits of what they do not.
  auto expect_refusals = [](const std::set<std::string>& set, const char* path) {
    for (const char* label : {"/step removed", "/layers = a string", "/files removed", "/files/0/crc32 = -7",
                              "/files/0/file = an object", "/files/0/optim/crc32 = 2.5", "/rng/ranks = null",
                              "/rng/files = an object", "/loss_scaler/scale = a string", "/format = true"}) {
      EXPECT_TRUE(set.count(label)) << path << ": " << label << " was loaded";
    }
    for (const char* label : {"/config removed", "/samples = a string", "/written_by removed"}) {
      EXPECT_FALSE(set.count(label)) << path << ": " << label << " was refused";
    }
  };
  expect_refusals(refused_one_process, "one process");
  expect_refusals(refused, "engine");
  // The untouched manifest still loads.
  write(original);
  EXPECT_EQ(load_checkpoint(built, ckpt, &adamw, "AdamW"), 2);
}

}  // namespace
}  // namespace pipetrain::testing
