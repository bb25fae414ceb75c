// Per-layer checkpoints: collective, atomic and durable save, layout-independent load.
#include "pipetrain/engine/layer_checkpoint.h"

#include <fmt/format.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint_device.h"
#include "checkpoint_fault.h"
#include "durable_file.h"
#include "optimizer_compat.h"
#include "tensor_parallel_state.h"
#include "pipetrain/error.h"
#include "pipetrain/runtime/rng.h"

namespace pipetrain {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kFormat = 1;

// What a user can do about a damaged checkpoint.
constexpr const char* kRestoreFix =
    "restore the checkpoint directory from a copy, or resume from another checkpoint (or start without --resume)";

std::function<void(const std::string&)>& fault_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

void at_phase(const char* phase) {
  if (fault_hook()) fault_hook()(phase);
}

// Where the checkpoint named `dir` is: `dir`, or `dir.old` when a save died between moving
// the previous checkpoint aside and moving the new one in.
fs::path resolve_dir(const fs::path& dir) {
  if (fs::exists(dir / "manifest.json")) return dir;
  const fs::path old(dir.string() + ".old");
  if (fs::exists(old / "manifest.json")) return old;
  return dir;
}

std::string layer_file(int64_t index) { return fmt::format("layer_{:05d}.pt", index); }
std::string optim_file(int64_t index) { return fmt::format("layer_{:05d}-optim.pt", index); }
// ZeRO-1: the part of a layer's optimizer state that data-parallel replica `shard` updates.
std::string optim_shard_file(int64_t index, int shard) { return fmt::format("layer_{:05d}-optim-{}.pt", index, shard); }
std::string rng_file(int rank) { return fmt::format("rng_rank_{:05d}.pt", rank); }

// Writes the archive to `path` through a DurableFile: every write checked, the file synced.
void save_archive(torch::serialize::OutputArchive& archive, const fs::path& path) {
  DurableFile file(path);
  try {
    archive.save_to(file.writer());
  } catch (const c10::Error& e) {
    throw CheckpointError("cannot write " + path.string() + ": " + e.what_without_backtrace());
  }
  file.commit();
}

// The rank's random streams: PipelineEngine::random_stream (dropout and every other random op of
// its layers draw from it) and, under tensor parallelism, the sharded regions' stream.
void save_rng_state(const PipelineEngine& engine, const fs::path& path) {
  // torch::save's layout (the tensor under key "0"), so that torch::load reads it back.
  torch::serialize::OutputArchive archive;
  archive.write("0", runtime::generator_state(engine.random_stream()));
  const auto& sharded = engine.tensor_parallel().sharded_rng;
  if (sharded.defined()) archive.write("sharded", runtime::generator_state(sharded));
  save_archive(archive, path);
}

void load_rng_state(const PipelineEngine& engine, const fs::path& path) {
  torch::serialize::InputArchive archive;
  // Generator states are CPU byte tensors, whatever the generator's device.
  archive.load_from(path.string(), c10::Device(c10::kCPU));
  auto restore = [&](const char* key, const at::Generator& gen) {
    torch::Tensor state;
    if (!archive.try_read(key, state)) return false;
    runtime::set_generator_state(gen, state);
    return true;
  };
  if (!restore("0", engine.random_stream())) {
    throw CheckpointError(path.string() + " holds no random stream; the checkpoint is damaged, resume from another");
  }
  // Written before sharded streams existed (its run drew sharded regions from the replicated
  // stream): the run continues with a fresh sharded stream.
  const auto& sharded = engine.tensor_parallel().sharded_rng;
  if (sharded.defined()) restore("sharded", sharded);
}

using detail::optimizer_state_key;

// An empty per-parameter state of the optimizer `type` (make_optimizer's names), to load into.
std::unique_ptr<torch::optim::OptimizerParamState> empty_state(const std::string& type) {
  if (type == "SGD") return std::make_unique<torch::optim::SGDParamState>();
  if (type == "Adam") return std::make_unique<torch::optim::AdamParamState>();
  if (type == "AdamW") return std::make_unique<torch::optim::AdamWParamState>();
  if (type == "RMSprop") return std::make_unique<torch::optim::RMSpropParamState>();
  if (type == "Adagrad") return std::make_unique<torch::optim::AdagradParamState>();
  throw CheckpointError("optimizer state of type \"" + type + "\" cannot be loaded; expected SGD, Adam, AdamW, "
                        "RMSprop or Adagrad");
}

// The optimizer's state for the module's parameters, by their index in parameters(). False
// (no file) when the optimizer keeps no state for them (SGD without momentum, before a step).
bool save_optimizer_state(const torch::optim::Optimizer& optimizer, const torch::nn::AnyModule& module,
                          const fs::path& path) {
  const auto params = module.ptr()->parameters();
  const auto& state = optimizer.state();
  torch::serialize::OutputArchive archive;
  bool any = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = state.find(optimizer_state_key(params[i]));
    if (it == state.end()) continue;
    torch::serialize::OutputArchive one;
    it->second->serialize(one);
    archive.write("param_" + std::to_string(i), one);
    any = true;
  }
  if (!any) return false;
  save_archive(archive, path);
  return true;
}

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

// The layer whose file holds layer i's module: itself, or a tied key's first use. A key that
// ties only some parameters (DeepSpeed's tied_weight_attr) leaves each use's module its own
// other parameters, so each use has its own file, as DeepSpeed writes one per layer.
std::vector<int64_t> owners(const std::vector<LayerSpec>& specs) {
  std::map<std::string, int64_t> first;
  std::vector<int64_t> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& key = specs[i].tied_key;
    if (key.empty() || !specs[i].tied_params.empty()) {
      out.push_back(static_cast<int64_t>(i));
      continue;
    }
    first.emplace(key, static_cast<int64_t>(i));
    out.push_back(first[key]);
  }
  return out;
}

// The files a load reads: as owners(), except that a use with no file of its own (written while
// its key tied the whole module) loads its key's first use, the one file written then.
std::vector<int64_t> load_owners(const std::vector<LayerSpec>& specs, const json& manifest) {
  auto out = owners(specs);
  std::map<std::string, int64_t> first;
  const auto& files = manifest.at("files");
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& key = specs[i].tied_key;
    if (key.empty()) continue;
    first.emplace(key, static_cast<int64_t>(i));
    if (!files.contains(std::to_string(out[i]))) out[i] = first[key];
  }
  return out;
}

// A manifest that parsed but lacks a field a load reads, or holds one of another type (edited
// by hand, written by another tool), is refused before anything is loaded from it.
void check_manifest(const json& m, const fs::path& path) {
  auto fail = [&](const std::string& what) {
    throw CheckpointError(
        fmt::format("{} is not a pipetrain checkpoint manifest: {}; {}", path.string(), what, kRestoreFix));
  };
  auto require = [&](const json& j, const std::string& where, bool ok, const char* expected) {
    if (!ok) fail(fmt::format("{} is {}, expected {}", where, j.type_name(), expected));
  };
  auto field = [&](const json& parent, const std::string& where, const char* key) -> const json& {
    if (!parent.contains(key)) fail(fmt::format("{} has no \"{}\"", where, key));
    return parent.at(key);
  };
  auto integer = [&](const json& parent, const std::string& where, const char* key, bool count = true) {
    const auto& j = field(parent, where, key);
    require(j, fmt::format("{}.{}", where, key), j.is_number_integer(), "an integer");
    if (count && j.get<int64_t>() < 0) fail(fmt::format("{}.{} is {}, expected a count >= 0", where, key, j.dump()));
  };
  auto file_entry = [&](const json& e, const std::string& where) {
    require(e, where, e.is_object(), "an object");
    const auto& file = field(e, where, "file");
    require(file, where + ".file", file.is_string(), "a string");
    const auto name = file.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      fail(fmt::format("{}.file \"{}\" is not the name of a file in the checkpoint directory", where, name));
    }
    const auto& crc = field(e, where, "crc32");
    require(crc, where + ".crc32", crc.is_number_unsigned(), "an unsigned integer");
  };
  require(m, "its top level", m.is_object(), "an object");
  // Another format may lay its fields out otherwise: say which format it is before anything else.
  if (!m.contains("format") || !m.at("format").is_number_integer() || m.at("format").get<int64_t>() != kFormat) {
    throw CheckpointError(fmt::format("{} has checkpoint format {}; this pipetrain reads format {}",
                                      path.parent_path().string(), m.value("format", json(0)).dump(), kFormat));
  }
  integer(m, "the manifest", "layers");
  integer(m, "the manifest", "step");
  const auto& files = field(m, "the manifest", "files");
  require(files, "files", files.is_object(), "an object");
  for (const auto& [key, entry] : files.items()) {
    if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos) {
      fail(fmt::format("files has the key \"{}\", expected a layer index", key));
    }
    const auto where = "files." + key;
    file_entry(entry, where);
    if (entry.contains("optim")) file_entry(entry.at("optim"), where + ".optim");
    if (entry.contains("optim_shards")) {
      const auto& shards = entry.at("optim_shards");
      require(shards, where + ".optim_shards", shards.is_array(), "an array");
      for (size_t i = 0; i < shards.size(); ++i) file_entry(shards[i], fmt::format("{}.optim_shards[{}]", where, i));
    }
  }
  if (m.contains("optimizer")) require(m.at("optimizer"), "optimizer", m.at("optimizer").is_string(), "a string");
  if (m.contains("rng")) {
    const auto& rng = m.at("rng");
    require(rng, "rng", rng.is_object(), "an object");
    integer(rng, "rng", "ranks");
    const auto& rng_files = field(rng, "rng", "files");
    require(rng_files, "rng.files", rng_files.is_object(), "an object");
    for (const auto& [key, entry] : rng_files.items()) file_entry(entry, "rng.files." + key);
    const auto ranks = rng.at("ranks").get<int64_t>();
    if (ranks > static_cast<int64_t>(rng_files.size())) {
      fail(fmt::format("rng.ranks is {} but rng.files lists {}", ranks, rng_files.size()));
    }
    for (int64_t r = 0; r < ranks; ++r) field(rng_files, "rng.files", std::to_string(r).c_str());
  }
  if (m.contains("written_by")) {
    const auto& by = m.at("written_by");
    require(by, "written_by", by.is_object(), "an object");
    for (const char* key : {"stages", "replicas", "tensor_parallel", "chunks"}) {
      if (by.contains(key)) integer(by, "written_by", key);
    }
  }
  if (m.contains("loss_scaler")) {
    const auto& scaler = m.at("loss_scaler");
    require(scaler, "loss_scaler", scaler.is_object(), "an object");
    const auto& scale = field(scaler, "loss_scaler", "scale");
    require(scale, "loss_scaler.scale", scale.is_number(), "a number");
    for (const char* key : {"iteration", "last_overflow", "hysteresis_left"}) {
      integer(scaler, "loss_scaler", key, /*count=*/false);
    }
  }
}

json read_manifest(fs::path& dir) {
  dir = resolve_dir(dir);
  const auto path = dir / "manifest.json";
  std::ifstream in(path);
  if (!in) {
    throw CheckpointError("no checkpoint in " + dir.string() + " (" + path.string() +
                          " is missing); train without --resume first, or point to a checkpoint directory");
  }
  json manifest;
  try {
    manifest = json::parse(in);
  } catch (const std::exception& e) {
    throw CheckpointError(path.string() + " is not valid JSON (" + e.what() + "); the checkpoint is corrupt: " +
                          kRestoreFix);
  }
  check_manifest(manifest, path);
  return manifest;
}

void save_module(const torch::nn::AnyModule& module, const fs::path& path) {
  torch::serialize::OutputArchive archive;
  try {
    module.ptr()->save(archive);
  } catch (const c10::Error& e) {
    throw CheckpointError("cannot serialize the module for " + path.string() + ": " + e.what_without_backtrace());
  }
  save_archive(archive, path);
}

// Checks the file the manifest entry describes against its CRC-32; returns its path.
fs::path verified(const fs::path& dir, const json& entry) {
  const auto path = dir / entry.at("file").get<std::string>();
  if (!fs::exists(path)) {
    throw CheckpointError("checkpoint file " + path.string() + " is missing; " + kRestoreFix);
  }
  const uint32_t expected = entry.at("crc32").get<uint32_t>();
  const uint32_t actual = file_crc32(path);
  if (expected != actual) {
    throw CheckpointError(fmt::format("checkpoint file {} is corrupt: CRC-32 {:08x}, the manifest says {:08x}; {}",
                                      path.string(), actual, expected, kRestoreFix));
  }
  return path;
}

const json& layer_entry(const fs::path& dir, const json& manifest, int64_t owner) {
  const auto& files = manifest.at("files");
  const auto key = std::to_string(owner);
  if (!files.contains(key)) throw CheckpointError(dir.string() + "/manifest.json lists no file for layer " + key);
  return files.at(key);
}

// Loads the stored optimizer state of the module's parameters into `optimizer` (of `type`):
// from the layer's one file, or merged from the parts ZeRO-1 replicas wrote. Only parameters
// the optimizer updates take state, so a ZeRO-1 shard of any replica count loads what it owns.
// A layer saved without state (none yet) leaves the optimizer's as it is.
void load_optimizer_state(torch::optim::Optimizer& optimizer, const std::string& type,
                          const torch::nn::AnyModule& module, const fs::path& dir, const json& manifest,
                          int64_t owner, int64_t layer) {
  const auto& entry = layer_entry(dir, manifest, owner);
  std::vector<json> parts;
  if (entry.contains("optim")) parts.push_back(entry.at("optim"));
  if (entry.contains("optim_shards")) {
    for (const auto& shard : entry.at("optim_shards")) parts.push_back(shard);
  }
  if (parts.empty()) return;
  const std::string stored_type = manifest.value("optimizer", "");
  if (stored_type != type) {
    throw CheckpointError(fmt::format("{} holds {} optimizer state but this run's optimizer is {}; use the "
                                      "same \"optimizer\" type to resume",
                                      dir.string(), stored_type, type));
  }
  std::set<detail::OptimizerStateKey> updated;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) updated.insert(optimizer_state_key(p));
  }
  const auto params = module.ptr()->parameters();
  for (const auto& part : parts) {
    const auto path = verified(dir, part);
    try {
      torch::serialize::InputArchive archive;
      // The state lives beside its parameters (an optimizer step mixes them).
      archive.load_from(path.string(), detail::checkpoint_load_device(*module.ptr()));
      for (size_t i = 0; i < params.size(); ++i) {
        const auto key = optimizer_state_key(params[i]);
        if (!updated.count(key)) continue;
        torch::serialize::InputArchive one;
        if (!archive.try_read("param_" + std::to_string(i), one)) continue;
        auto state = empty_state(type);
        state->serialize(one);
        optimizer.state()[key] = std::move(state);
      }
    } catch (const c10::Error& e) {
      throw CheckpointError(fmt::format("optimizer state of layer {} does not match {}: {}", layer, path.string(),
                                        e.what_without_backtrace()));
    }
  }
}

// DeepSpeed's load_module_strict=False: what the file and the module share loads, the rest of
// either side is left alone.
void load_module_lenient(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  for (auto& p : module.named_parameters(/*recurse=*/false)) archive.try_read(p.key(), p.value());
  for (auto& b : module.named_buffers(/*recurse=*/false)) archive.try_read(b.key(), b.value(), /*is_buffer=*/true);
  for (auto& child : module.named_children()) {
    torch::serialize::InputArchive child_archive;
    if (archive.try_read(child.key(), child_archive)) load_module_lenient(*child.value(), child_archive);
  }
}

// Loads layer `layer`'s file into `module`: every tensor of both sides (strict), or only those
// they share.
void load_module(torch::nn::AnyModule& module, const fs::path& dir, const json& manifest, int64_t owner,
                 int64_t layer, bool strict = true) {
  const auto path = verified(dir, layer_entry(dir, manifest, owner));
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path.string(), detail::checkpoint_load_device(*module.ptr()));
    torch::NoGradGuard no_grad;
    if (strict) {
      module.ptr()->load(archive);
    } else {
      load_module_lenient(*module.ptr(), archive);
    }
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("layer {} does not match {}: {}", layer, path.string(),
                                      e.what_without_backtrace()));
  }
}

void check_layers(const json& manifest, size_t layers, const fs::path& dir) {
  const auto stored = manifest.at("layers").get<int64_t>();
  if (stored != static_cast<int64_t>(layers)) {
    throw CheckpointError(fmt::format("the checkpoint in {} holds {} layers but the model has {}; it was "
                                      "written by another model",
                                      dir.string(), stored, layers));
  }
}

// Each rank's random stream continues where it stopped, so a resume under the same layout
// draws the same dropout masks as the uninterrupted run. Under another layout the ranks hold
// other layers, and their streams do not carry over.
void restore_rng_if_same_layout(PipelineEngine& engine, const fs::path& dir, const json& manifest) {
  if (!manifest.contains("rng") || !manifest.contains("written_by")) return;
  const auto& by = manifest.at("written_by");
  const bool same = manifest.at("rng").value("ranks", -1) == engine.communicator().world_size() &&
                    by.value("stages", -1) == engine.num_stages() && by.value("replicas", -1) == engine.num_replicas() &&
                    by.value("tensor_parallel", 1) == engine.tensor_parallel_size() &&
                    by.value("chunks", -1) == engine.num_chunks();
  if (!same) return;
  const auto& entry = manifest.at("rng").at("files").at(std::to_string(engine.communicator().rank()));
  load_rng_state(engine, verified(dir, entry));
}

// Moves the complete, synced files in `partial` to `dir`, keeping the previous checkpoint until
// the new one is durable. Every rename has its directories synced before and after (the last
// one by hand, to let the fault hook in between), so at each fault phase a power loss leaves a
// loadable checkpoint on disk:
//
//   phase     on disk                                       load_checkpoint finds
//   manifest  dir (previous), dir.partial (new, synced)     dir: the previous one
//   swap      dir.old (previous), dir.partial               dir.old: the previous one
//   renamed   dir (new), dir.old; the parent not synced     whichever rename the disk kept
//   synced    dir (new, durable), dir.old                   dir: the new one
//
// Only after "synced" is dir.old deleted: before it, the rename may still be undone by a crash.
void install(const fs::path& partial, const fs::path& dir) {
  const fs::path old(dir.string() + ".old");
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  sync_directory(partial);  // the files' names (each file synced itself when written)
  sync_directory(parent);   // partial's own name
  // A previous save that died mid-swap left the newest complete checkpoint in .old.
  if (!fs::exists(dir / "manifest.json") && fs::exists(old / "manifest.json")) {
    fs::remove_all(dir);
    durable_rename(old, dir);
  }
  fs::remove_all(old);
  if (fs::exists(dir)) durable_rename(dir, old);
  at_phase("swap");
  fs::rename(partial, dir);
  at_phase("renamed");
  sync_directory(parent);
  at_phase("synced");
  fs::remove_all(old);
}

int64_t load_into(PipelineEngine& engine, const fs::path& dir, const json& manifest,
                  const CheckpointLoadOptions& options = {}) {
  check_layers(manifest, engine.module().layers.size(), dir);
  const auto owner = load_owners(engine.module().layers, manifest);
  // A layer the manifest lists no file for is found before any layer loads.
  for (const auto& [index, module] : engine.local_layers()) {
    layer_entry(dir, manifest, owner[static_cast<size_t>(index)]);
  }
  for (auto& [index, module] : engine.local_layers()) {
    load_module(module, dir, manifest, owner[static_cast<size_t>(index)], index, options.strict);
    if (options.module_only || !options.optimizer_states) {
      detail::cut_loaded_shards(*module.ptr(), engine.optimizer());
      continue;
    }
    if (engine.optimizer()) {
      load_optimizer_state(*engine.optimizer(), engine.config().optimizer.type, module, dir, manifest,
                           owner[static_cast<size_t>(index)], index);
    }
    detail::cut_loaded_shards(*module.ptr(), engine.optimizer());
  }
  engine.parameters_changed();
  if (options.module_only) return manifest.at("step").get<int64_t>();
  restore_rng_if_same_layout(engine, dir, manifest);
  // A run resumed in fp16 continues with the saved scale (one saved in another precision, or
  // before fp16 was on, starts from the config's initial scale).
  if (LossScaler* scaler = engine.loss_scaler(); scaler && manifest.contains("loss_scaler")) {
    const auto& j = manifest.at("loss_scaler");
    LossScaler::State st;
    st.scale = j.at("scale").get<double>();
    st.iteration = j.at("iteration").get<int64_t>();
    st.last_overflow = j.at("last_overflow").get<int64_t>();
    st.hysteresis_left = j.at("hysteresis_left").get<int64_t>();
    scaler->restore(st);
  }
  const auto step = manifest.at("step").get<int64_t>();
  engine.set_global_steps(step);
  return step;
}

int64_t load_into(BuiltLayers& layers, const fs::path& dir, const json& manifest, torch::optim::Optimizer* optimizer,
                  const std::string& optimizer_type) {
  check_layers(manifest, layers.specs.size(), dir);
  const auto owner = load_owners(layers.specs, manifest);
  for (size_t i = 0; i < layers.modules.size(); ++i) layer_entry(dir, manifest, owner[i]);  // before any loads
  std::set<const void*> seen;
  for (size_t i = 0; i < layers.modules.size(); ++i) {
    if (!seen.insert(layers.modules[i].ptr().get()).second) continue;
    load_module(layers.modules[i], dir, manifest, owner[i], static_cast<int64_t>(i));
    if (optimizer) {
      load_optimizer_state(*optimizer, optimizer_type, layers.modules[i], dir, manifest, owner[i],
                           static_cast<int64_t>(i));
    }
  }
  return manifest.at("step").get<int64_t>();
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
    at_phase("start");
    // Replicas hold equal weights: replica 0 writes them. Under ZeRO-1 each replica holds the
    // optimizer state of its own parameters and writes that part; a load merges the parts.
    const bool sharded = engine.zero_partition().replicas() > 1;
    if (engine.replica() == 0 || sharded) {
      for (const auto& [index, module] : engine.local_layers()) {
        if (owner[static_cast<size_t>(index)] != index) continue;
        // Tensor-parallel slices are written whole, by the group's first rank.
        detail::FullTensors full(*module.ptr(), engine.tensor_parallel(), engine.optimizer());
        if (engine.tensor_rank() != 0) continue;
        if (engine.replica() == 0) save_module(module, partial / layer_file(index));
        if (engine.optimizer()) {
          save_optimizer_state(*engine.optimizer(), module,
                               partial / (sharded ? optim_shard_file(index, engine.replica()) : optim_file(index)));
        }
      }
    }
    save_rng_state(engine, partial / rng_file(comm.rank()));
    at_phase("files");
    world.barrier("checkpoint files written");
    if (comm.rank() == 0) {
      json files = json::object();
      for (size_t i = 0; i < owner.size(); ++i) {
        if (owner[i] != static_cast<int64_t>(i)) continue;
        const auto path = partial / layer_file(static_cast<int64_t>(i));
        if (!fs::exists(path)) throw CheckpointError("layer file " + path.string() + " was not written");
        json entry = {{"file", layer_file(static_cast<int64_t>(i))},
                      {"crc32", file_crc32(path)},
                      {"bytes", fs::file_size(path)}};
        auto described = [&](const std::string& name) {
          const auto p = partial / name;
          return json{{"file", name}, {"crc32", file_crc32(p)}, {"bytes", fs::file_size(p)}};
        };
        if (fs::exists(partial / optim_file(static_cast<int64_t>(i)))) {
          entry["optim"] = described(optim_file(static_cast<int64_t>(i)));
        }
        json shards = json::array();
        for (int r = 0; r < engine.zero_partition().replicas(); ++r) {
          const auto name = optim_shard_file(static_cast<int64_t>(i), r);
          if (fs::exists(partial / name)) shards.push_back(described(name));
        }
        if (!shards.empty()) entry["optim_shards"] = shards;
        files[std::to_string(i)] = entry;
      }
      json rng = json::object();
      for (int r = 0; r < comm.world_size(); ++r) {
        const auto path = partial / rng_file(r);
        if (!fs::exists(path)) throw CheckpointError("the RNG state of rank " + std::to_string(r) + " was not written");
        rng[std::to_string(r)] = {{"file", rng_file(r)}, {"crc32", file_crc32(path)}, {"bytes", fs::file_size(path)}};
      }
      json manifest = {{"format", kFormat},
                       {"step", engine.global_steps()},
                       {"samples", engine.global_steps() * engine.config().train_batch_size},
                       {"config", json::parse(engine.config().to_json_text())},
                       {"rng", {{"ranks", comm.world_size()}, {"files", rng}}},
                       {"layers", owner.size()},
                       {"written_by", {{"stages", engine.num_stages()},
                                       {"replicas", engine.num_replicas()},
                                       {"tensor_parallel", engine.tensor_parallel_size()},
                                       {"chunks", engine.num_chunks()}}},
                       {"optimizer", engine.config().optimizer.type},
                       {"files", files}};
      if (!extra.empty()) manifest["extra"] = json::parse(extra);
      // Every rank's scaler agrees (overflows are agreed collectively): rank 0's speaks for all.
      if (const LossScaler* scaler = engine.loss_scaler()) {
        const auto& st = scaler->state();
        manifest["loss_scaler"] = {{"scale", st.scale},
                                   {"iteration", st.iteration},
                                   {"last_overflow", st.last_overflow},
                                   {"hysteresis_left", st.hysteresis_left}};
      }
      write_durable_file(partial / "manifest.json", manifest.dump(2) + "\n");
      at_phase("manifest");
      install(partial, dir);
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

void checkpoint_fault_point(const std::string& phase) { at_phase(phase.c_str()); }

void set_checkpoint_fault_hook(std::function<void(const std::string& phase)> hook) {
  fault_hook() = std::move(hook);
}

int64_t load_checkpoint(PipelineEngine& engine, const std::string& dir_name) {
  fs::path dir(dir_name);
  const auto manifest = read_manifest(dir);
  return load_into(engine, dir, manifest);
}

LoadedCheckpoint load_checkpoint(PipelineEngine& engine, const std::string& dir_name,
                                 const CheckpointLoadOptions& options) {
  fs::path dir(dir_name);
  const auto manifest = read_manifest(dir);  // resolves dir to dir.old after an interrupted save
  LoadedCheckpoint loaded;
  loaded.step = load_into(engine, dir, manifest, options);
  loaded.dir = dir.string();
  if (manifest.contains("extra")) loaded.extra = manifest.at("extra").dump();
  return loaded;
}

int64_t load_checkpoint(BuiltLayers& layers, const std::string& dir_name, torch::optim::Optimizer* optimizer,
                        const std::string& optimizer_type) {
  fs::path dir(dir_name);
  const auto manifest = read_manifest(dir);
  return load_into(layers, dir, manifest, optimizer, optimizer_type);
}

int64_t checkpoint_step(const std::string& dir_name) {
  try {
    fs::path dir(dir_name);
    const auto m = read_manifest(dir);
    return m.at("step").get<int64_t>();
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace pipetrain
