// Tagged checkpoints and the `latest` pointer (DeepSpeed's directory layout).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_fault.h"
#include "durable_file.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/error.h"

namespace pipetrain {

namespace fs = std::filesystem;

namespace {

void check_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\n') != std::string::npos) {
    throw CheckpointError("checkpoint tag \"" + tag + "\" must be a plain directory name (no '/', not '.' or '..')");
  }
}

// The tag to load: `tag`, or the one <load_dir>/latest names when it is "".
std::string resolve_tag(const std::string& load_dir, const std::string& tag_in) {
  std::string tag = tag_in;
  if (tag.empty()) {
    tag = latest_tag(load_dir);
    if (tag.empty()) {
      throw CheckpointError(load_dir + " has no 'latest' pointer; name a tag, or pass a directory written by "
                            "save_tagged_checkpoint");
    }
  }
  check_tag(tag);
  return tag;
}

}  // namespace

std::string latest_tag(const std::string& save_dir) {
  std::ifstream in(fs::path(save_dir) / "latest");
  std::string tag;
  if (!in || !std::getline(in, tag)) return "";
  return tag;
}

std::string save_tagged_checkpoint(PipelineEngine& engine, const std::string& save_dir, const std::string& tag_in,
                                   const std::string& extra) {
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", engine.global_steps()) : tag_in;
  check_tag(tag);
  auto& world = engine.communicator().world();
  if (engine.communicator().rank() == 0) fs::create_directories(save_dir);
  save_checkpoint(engine, (fs::path(save_dir) / tag).string(), extra);  // collective; ends with a barrier
  if (engine.communicator().rank() == 0) {
    checkpoint_fault_point("latest");
    // Synced before the rename and the directory after, as the tag's own directory was: a
    // pointer that a power loss leaves empty would hide every tag.
    const fs::path tmp = fs::path(save_dir) / "latest.tmp";
    write_durable_file(tmp, tag + "\n");
    durable_rename(tmp, fs::path(save_dir) / "latest");
  }
  world.barrier("checkpoint pointer moved");
  return tag;
}

LoadedCheckpoint load_tagged_checkpoint(PipelineEngine& engine, const std::string& load_dir, const std::string& tag,
                                        const CheckpointLoadOptions& options) {
  return load_checkpoint(engine, (fs::path(load_dir) / resolve_tag(load_dir, tag)).string(), options);
}

int64_t load_tagged_checkpoint(PipelineEngine& engine, const std::string& load_dir, const std::string& tag) {
  return load_checkpoint(engine, (fs::path(load_dir) / resolve_tag(load_dir, tag)).string());
}

}  // namespace pipetrain
