// Per-layer checkpoints: collective, atomic save and layout-independent load.
#include "pipetrain/engine/layer_checkpoint.h"

#include <fmt/format.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "pipetrain/error.h"

namespace pipetrain {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kFormat = 1;

std::string layer_file(int64_t index) { return fmt::format("layer_{:05d}.pt", index); }

uint32_t file_crc32(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read " + path.string());
  std::vector<char> buffer(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), static_cast<uInt>(in.gcount()));
  }
  return static_cast<uint32_t>(crc);
}

// The layer whose file holds layer i's module: itself, or a tied key's first use.
std::vector<int64_t> owners(const std::vector<LayerSpec>& specs) {
  std::map<std::string, int64_t> first;
  std::vector<int64_t> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& key = specs[i].tied_key;
    if (key.empty()) {
      out.push_back(static_cast<int64_t>(i));
      continue;
    }
    first.emplace(key, static_cast<int64_t>(i));
    out.push_back(first[key]);
  }
  return out;
}

json read_manifest(const fs::path& dir) {
  const auto path = dir / "manifest.json";
  std::ifstream in(path);
  if (!in) {
    throw CheckpointError("no checkpoint in " + dir.string() + " (" + path.string() +
                          " is missing); train without --resume first, or point to a checkpoint directory");
  }
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw CheckpointError(path.string() + " is not valid JSON (" + e.what() + "); the checkpoint is corrupt");
  }
}

void save_module(const torch::nn::AnyModule& module, const fs::path& path) {
  try {
    torch::serialize::OutputArchive archive;
    module.ptr()->save(archive);
    archive.save_to(path.string());
  } catch (const c10::Error& e) {
    throw CheckpointError("cannot write " + path.string() + ": " + e.what_without_backtrace());
  }
}

void load_module(torch::nn::AnyModule& module, const fs::path& dir, const json& manifest, int64_t owner,
                 int64_t layer) {
  const auto name = layer_file(owner);
  const auto path = dir / name;
  const auto& files = manifest.at("files");
  const auto key = std::to_string(owner);
  if (!files.contains(key)) throw CheckpointError(dir.string() + "/manifest.json lists no file for layer " + key);
  if (!fs::exists(path)) throw CheckpointError("checkpoint file " + path.string() + " is missing");
  const uint32_t expected = files.at(key).at("crc32").get<uint32_t>();
  const uint32_t actual = file_crc32(path);
  if (expected != actual) {
    throw CheckpointError(fmt::format("checkpoint file {} is corrupt: CRC-32 {:08x}, the manifest says {:08x}",
                                      path.string(), actual, expected));
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path.string());
    torch::NoGradGuard no_grad;
    module.ptr()->load(archive);
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("layer {} does not match {}: {}", layer, path.string(),
                                      e.what_without_backtrace()));
  }
}

void check_layers(const json& manifest, size_t layers, const fs::path& dir) {
  if (manifest.value("format", 0) != kFormat) {
    throw CheckpointError(dir.string() + " has checkpoint format " + manifest.value("format", json(0)).dump() +
                          "; this pipetrain reads format " + std::to_string(kFormat));
  }
  const auto stored = manifest.at("layers").get<int64_t>();
  if (stored != static_cast<int64_t>(layers)) {
    throw CheckpointError(fmt::format("the checkpoint in {} holds {} layers but the model has {}; it was "
                                      "written by another model",
                                      dir.string(), stored, layers));
  }
}

}  // namespace

void save_checkpoint(PipelineEngine& engine, const std::string& dir_name, const std::string& extra) {
  auto& comm = engine.communicator();
  auto& world = comm.world();
  const fs::path dir(dir_name);
  const fs::path partial(dir_name + ".partial");
  const auto owner = owners(engine.module().layers);
  try {
    if (comm.rank() == 0) {
      fs::remove_all(partial);
      fs::create_directories(partial);
    }
    world.barrier("checkpoint start");
    // Replicas hold equal weights: replica 0 writes.
    if (engine.replica() == 0) {
      for (const auto& [index, module] : engine.local_layers()) {
        if (owner[static_cast<size_t>(index)] != index) continue;
        save_module(module, partial / layer_file(index));
      }
    }
    world.barrier("checkpoint files written");
    if (comm.rank() == 0) {
      json files = json::object();
      for (size_t i = 0; i < owner.size(); ++i) {
        if (owner[i] != static_cast<int64_t>(i)) continue;
        const auto path = partial / layer_file(static_cast<int64_t>(i));
        if (!fs::exists(path)) throw CheckpointError("layer file " + path.string() + " was not written");
        files[std::to_string(i)] = {{"file", layer_file(static_cast<int64_t>(i))},
                                    {"crc32", file_crc32(path)},
                                    {"bytes", fs::file_size(path)}};
      }
      json manifest = {{"format", kFormat},
                       {"step", engine.global_steps()},
                       {"layers", owner.size()},
                       {"written_by", {{"stages", engine.num_stages()},
                                       {"replicas", engine.num_replicas()},
                                       {"chunks", engine.num_chunks()}}},
                       {"files", files}};
      if (!extra.empty()) manifest["extra"] = json::parse(extra);
      std::ofstream(partial / "manifest.json") << manifest.dump(2) << "\n";
      const fs::path old(dir_name + ".old");
      fs::remove_all(old);
      if (fs::exists(dir)) fs::rename(dir, old);
      fs::rename(partial, dir);
      fs::remove_all(old);
    }
    world.barrier("checkpoint done");
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    comm.report_failure(e.what());
    if (dynamic_cast<const CheckpointError*>(&e)) throw;
    throw CheckpointError("saving the checkpoint in " + dir_name + " failed: " + e.what());
  }
}

int64_t load_checkpoint(PipelineEngine& engine, const std::string& dir_name) {
  const fs::path dir(dir_name);
  const auto manifest = read_manifest(dir);
  check_layers(manifest, engine.module().layers.size(), dir);
  const auto owner = owners(engine.module().layers);
  for (auto& [index, module] : engine.local_layers()) {
    load_module(module, dir, manifest, owner[static_cast<size_t>(index)], index);
  }
  engine.parameters_changed();
  const auto step = manifest.at("step").get<int64_t>();
  engine.set_global_steps(step);
  return step;
}

int64_t load_checkpoint(BuiltLayers& layers, const std::string& dir_name) {
  const fs::path dir(dir_name);
  const auto manifest = read_manifest(dir);
  check_layers(manifest, layers.specs.size(), dir);
  const auto owner = owners(layers.specs);
  std::set<const void*> seen;
  for (size_t i = 0; i < layers.modules.size(); ++i) {
    if (!seen.insert(layers.modules[i].ptr().get()).second) continue;
    load_module(layers.modules[i], dir, manifest, owner[i], static_cast<int64_t>(i));
  }
  return manifest.at("step").get<int64_t>();
}

int64_t checkpoint_step(const std::string& dir) {
  try {
    const auto m = read_manifest(dir);
    return m.at("step").get<int64_t>();
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace pipetrain
