// Per-layer checkpoints: one file per layer, indexed by the layer's global position, so a run
// can resume with another number of stages, chunks or replicas, and one process can load a
// whole pipelined model (to generate text, say).
//
//   <dir>/manifest.json     {"format": 1, "step": 120, "samples": 15360, "layers": 9,
//                            "written_by": {"stages": 2, ...}, "config": {...}, "optimizer": "Adam",
//                            "files": {"0": {"crc32": ...}}, "rng": {"ranks": 2, "files": {...}}}
//   <dir>/layer_00000.pt    the module of layer 0 (parameters and buffers)
//   <dir>/layer_00000-optim.pt  its parameters' optimizer state (momentum, Adam moments, step),
//                               where the optimizer keeps any; the manifest names the type
//   <dir>/rng_rank_00000.pt the default generator of rank 0, restored when the same layout
//                           loads (dropout masks continue as if nothing happened)
//
// A tied module is stored once, under its first use. Writing is collective, atomic and durable:
// every rank writes into <dir>.partial and fsyncs each file, rank 0 checks every file, writes
// and syncs the manifest, syncs the directories, then moves the directory into place (the
// previous one to <dir>.old first), syncing the parent after each rename. <dir>.old is deleted
// only once the new checkpoint is on disk, so neither a crash nor a power loss leaves less than
// one complete checkpoint (loads fall back to <dir>.old when one came between the two renames).
// Every write, fsync and close is checked: a full disk is a CheckpointError naming the file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/partition/layer_spec.h"

namespace pipetrain {

// Collective over the engine's world. `extra` is stored in the manifest as a JSON object
// text (e.g. the example name); "" for none. CheckpointError naming the file (and errno's
// text) when one cannot be written or synced; the previous checkpoint in `dir` is then intact.
void save_checkpoint(PipelineEngine& engine, const std::string& dir, const std::string& extra = "");

// Loads the layers this rank holds from `dir` (written by any layout of the same model), with
// their optimizer state, and returns the step stored there. CheckpointError for a missing or corrupt file (checksum), a
// layer count that differs from the model's, or a module whose parameters do not match.
int64_t load_checkpoint(PipelineEngine& engine, const std::string& dir);

// Loads every layer of a model built in one process (BuiltLayers of all specs), and with an
// optimizer over those layers' parameters, their optimizer state (`optimizer_type` as in the
// config: SGD, Adam, AdamW, RMSprop, Adagrad).
int64_t load_checkpoint(BuiltLayers& layers, const std::string& dir, torch::optim::Optimizer* optimizer = nullptr,
                        const std::string& optimizer_type = "");

// Several checkpoints side by side, as DeepSpeed keeps them: <save_dir>/<tag>/ (each written as
// save_checkpoint does) and <save_dir>/latest, a one-line file naming the newest complete tag.
// The pointer moves (written to latest.tmp, renamed) only after the tag's directory is in
// place, so a crash leaves it at the previous tag. Tag "" = "global_step<N>". Returns the tag.
std::string save_tagged_checkpoint(PipelineEngine& engine, const std::string& save_dir, const std::string& tag = "",
                                   const std::string& extra = "");
// Loads <load_dir>/<tag>, or the tag named by <load_dir>/latest when `tag` is "".
// CheckpointError naming the directory when there is no latest pointer.
int64_t load_tagged_checkpoint(PipelineEngine& engine, const std::string& load_dir, const std::string& tag = "");
// What a load restores (DeepSpeed's load_checkpoint flags).
struct CheckpointLoadOptions {
  bool strict = true;            // false: entries a layer file lacks, or has beyond the module's, are skipped
  bool optimizer_states = true;  // false: the optimizer keeps the state it has
  bool module_only = false;      // true: the layers alone; step, optimizer, RNG and loss scale stay as they are
};
// What a load read: the directory it came from (<tag>, or <tag>.old after an interrupted save),
// the stored step and the manifest's "extra" as JSON text ("" when none).
struct LoadedCheckpoint {
  std::string dir;
  int64_t step = 0;
  std::string extra;
};
// load_checkpoint with options, saying what it read.
LoadedCheckpoint load_checkpoint(PipelineEngine& engine, const std::string& dir, const CheckpointLoadOptions& options);
// load_tagged_checkpoint with options ("" = the tag `latest` names), saying what it read.
LoadedCheckpoint load_tagged_checkpoint(PipelineEngine& engine, const std::string& load_dir, const std::string& tag,
                                        const CheckpointLoadOptions& options);
// The tag <save_dir>/latest names, or "" when there is none.
std::string latest_tag(const std::string& save_dir);

// The manifest's step, or -1 when `dir` holds no complete checkpoint.
int64_t checkpoint_step(const std::string& dir);

// Fault injection for drills and tests: called on every rank at each phase of save_checkpoint
// ("start", "files": this rank's files written and synced; rank 0 only: "manifest": written
// into <dir>.partial, "swap": the previous checkpoint moved to <dir>.old, "renamed": the new one
// moved to <dir>, its parent directory not yet synced, "synced": the parent synced, <dir>.old
// about to be deleted; with tags, "latest": the tag's directory complete, the pointer not yet
// moved). A hook that kills the process shows what a crash there leaves: load_checkpoint and
// checkpoint_step still find a complete checkpoint (the previous one in <dir>, or in <dir>.old
// after a crash mid-swap; the new one from "renamed" on). Empty: none.
void set_checkpoint_fault_hook(std::function<void(const std::string& phase)> hook);

}  // namespace pipetrain
