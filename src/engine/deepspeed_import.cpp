// Importing DeepSpeed pipeline checkpoints (layer_XX-model_states.pt) by layer index and name.
#include "pipetrain/engine/deepspeed_import.h"

#include <fmt/format.h>
#include <caffe2/serialize/inline_container.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "pipetrain/comm/inprocess.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/error.h"
#include "state_dict_pickle.h"

namespace pipetrain {

namespace fs = std::filesystem;

namespace {

// DeepSpeed's ckpt_layer_path without tensor parallelism (whose shards add "-model_XX").
std::string deepspeed_layer_file(int64_t index) { return fmt::format("layer_{:02d}-model_states.pt", index); }

bool holds_layer_files(const fs::path& dir) {
  if (!fs::is_directory(dir)) return false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    const std::string suffix = "model_states.pt";
    if (name.rfind("layer_", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return true;
    }
  }
  return false;
}

std::string shape_text(c10::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

std::string names_text(const std::map<std::string, torch::Tensor>& named) {
  std::vector<std::string> names;
  for (const auto& [name, t] : named) names.push_back(name);
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

// The module's parameters and buffers under the names PyTorch's state_dict gives them.
std::map<std::string, torch::Tensor> module_state(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters(true)) out.emplace(item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) out.emplace(item.key(), item.value());
  return out;
}

// The file that holds layer `index`: its own, or for a tied use without one (DeepSpeed saves
// a tied use that runs a forward_fn as a function, without state), its key's first use's.
fs::path layer_path(const fs::path& tag_dir, const std::vector<LayerSpec>& specs, int64_t index) {
  const auto own = tag_dir / deepspeed_layer_file(index);
  const auto& spec = specs.at(static_cast<size_t>(index));
  if (fs::exists(own) || !spec.tied()) return own;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].tied_key == spec.tied_key && fs::exists(tag_dir / deepspeed_layer_file(static_cast<int64_t>(i)))) {
      return tag_dir / deepspeed_layer_file(static_cast<int64_t>(i));
    }
  }
  return own;
}

void load_layer(const torch::nn::AnyModule& module, const std::vector<LayerSpec>& specs, int64_t index,
                const fs::path& tag_dir) {
  const auto target = module_state(*module.ptr());
  const auto& name = specs.at(static_cast<size_t>(index)).name;
  const auto path = layer_path(tag_dir, specs, index);
  if (!fs::exists(path)) {
    if (target.empty()) return;  // a ReLU, say: nothing to load
    throw CheckpointError(fmt::format(
        "layer {} ({}) has parameters ({}) but the DeepSpeed checkpoint has no {}; point to the tag directory "
        "of a checkpoint of the same model (tensor-parallel shards, layer_XX-model_YY-model_states.pt, are not "
        "supported)",
        index, name, names_text(target), path.string()));
  }
  std::map<std::string, torch::Tensor> stored;
  for (auto& [key, value] : read_deepspeed_layer(path.string())) stored.emplace(key, value);
  // Missing keys first: a misspelt name then reads as "has X but the file does not hold it".
  for (const auto& [key, tensor] : target) {
    const auto it = stored.find(key);
    if (it == stored.end()) {
      throw CheckpointError(fmt::format(
          "layer {} ({}) has \"{}\" (shape {}) but {} does not hold it (it holds: {}); the checkpoint was written "
          "by another model: build the layers of the DeepSpeed PipelineModule in the same order",
          index, name, key, shape_text(tensor.sizes()), path.string(), names_text(stored)));
    }
    if (it->second.sizes() != tensor.sizes()) {
      throw CheckpointError(fmt::format(
          "{}: \"{}\" has shape {} in the file but {} in layer {} ({}); build layer {} with the DeepSpeed model's "
          "sizes",
          path.string(), key, shape_text(it->second.sizes()), shape_text(tensor.sizes()), index, name, index));
    }
  }
  for (const auto& [key, value] : stored) {
    if (!target.count(key)) {
      throw CheckpointError(fmt::format(
          "{} holds \"{}\" (shape {}), which layer {} ({}) does not have (it has: {}); the checkpoint was written "
          "by another model: build the layers of the DeepSpeed PipelineModule in the same order",
          path.string(), key, shape_text(value.sizes()), index, name, names_text(target)));
    }
  }
  // Only once every key fits, so that a mismatch leaves the layer as it was.
  torch::NoGradGuard no_grad;
  for (const auto& [key, tensor] : target) {
    tensor.copy_(stored.at(key));  // converts fp16/bf16 to the module's dtype, and moves to its device
  }
}

}  // namespace

std::string deepspeed_tag_dir(const std::string& dir_name) {
  const fs::path dir(dir_name);
  if (holds_layer_files(dir)) return dir.string();
  const auto tag = latest_tag(dir_name);
  if (tag.empty()) {
    throw CheckpointError(dir_name + " holds no DeepSpeed layer files (layer_XX-model_states.pt) and no 'latest' "
                          "pointer; pass the checkpoint's save directory or one of its tag directories (e.g. "
                          "global_step100)");
  }
  if (!holds_layer_files(dir / tag)) {
    throw CheckpointError(fmt::format("{}/latest names tag \"{}\" but {} holds no layer_XX-model_states.pt; the "
                                      "checkpoint is incomplete, or was not saved by a DeepSpeed PipelineModule",
                                      dir_name, tag, (dir / tag).string()));
  }
  return (dir / tag).string();
}

std::vector<std::pair<std::string, torch::Tensor>> read_deepspeed_layer(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader archive(path);
    const auto [data, size] = archive.getRecord("data.pkl");
    const std::string pickle(static_cast<const char*>(data.get()), size);
    // torch.save keeps each storage in the record data/<key>.
    auto records = [&](const std::string& key) -> std::pair<at::DataPtr, size_t> {
      auto [record, bytes] = archive.getRecord(archive.hasRecord("data/" + key) ? "data/" + key : key);
      return {std::move(record), bytes};
    };
    return detail::read_pickled_state_dict(pickle, records, path);
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("{} is not a torch.save file that LibTorch can read ({}); re-save it with "
                                      "torch.save in PyTorch >= 1.6 (the zip format)",
                                      path, e.what_without_backtrace()));
  }
}

std::string load_deepspeed_checkpoint(PipelineEngine& engine, const std::string& dir) {
  const fs::path tag_dir = deepspeed_tag_dir(dir);
  for (const auto& [index, module] : engine.local_layers()) load_layer(module, engine.module().layers, index, tag_dir);
  engine.parameters_changed();
  return tag_dir.string();
}

std::string load_deepspeed_checkpoint(BuiltLayers& layers, const std::string& dir) {
  const fs::path tag_dir = deepspeed_tag_dir(dir);
  // The specs of the range stand for the whole model when it starts at layer 0; tied uses
  // are then found among them.
  std::vector<LayerSpec> specs(static_cast<size_t>(layers.begin));
  specs.insert(specs.end(), layers.specs.begin(), layers.specs.end());
  std::set<const void*> seen;
  for (size_t i = 0; i < layers.modules.size(); ++i) {
    if (!seen.insert(layers.modules[i].ptr().get()).second) continue;
    load_layer(layers.modules[i], specs, layers.begin + static_cast<int64_t>(i), tag_dir);
  }
  return tag_dir.string();
}

void convert_deepspeed_checkpoint(PipelineModule module, const std::string& dir, const std::string& out_dir,
                                  EngineConfig config) {
  // save_checkpoint is collective over an engine's ranks: one rank in this process holds them all.
  config.pipeline.stages = 1;
  config.pipeline.chunks = 1;
  config.pipeline.schedule = "1f1b";
  config.pipeline.partition_method = "uniform";
  config.pipeline.balance.clear();
  auto hub = comm::InProcessHub::create(1);
  std::shared_ptr<comm::Communicator> comm = hub->endpoint(0);
  PipelineEngine engine(std::move(module), config, comm);
  const auto tag_dir = load_deepspeed_checkpoint(engine, dir);
  save_checkpoint(engine, out_dir, nlohmann::json{{"converted_from", "deepspeed"}, {"source", tag_dir}}.dump());
  comm->shutdown();
}

}  // namespace pipetrain
