// Importing DeepSpeed pipeline checkpoints: the per-layer state dicts DeepSpeed's PipelineModule
// writes, read without Python, into a PipelineEngine (each rank its own layers) or BuiltLayers.
//
//   <save_dir>/latest                               "global_step100": the newest tag
//   <save_dir>/global_step100/layer_00-model_states.pt   torch.save(layer.state_dict()) of layer 0
//   <save_dir>/global_step100/layer_02-model_states.pt   (a layer without state may have no file)
//
// Layers are matched by global index and their parameters and buffers by name (relative to the
// layer, as in PyTorch: "weight", "0.bias"); values are converted to the module's dtype
// (DeepSpeed's fp16 and bf16 checkpoints) and device. Only weights are imported: DeepSpeed keeps
// optimizer state in ZeRO-partitioned files of its own, so training starts a fresh optimizer.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/partition/layer_spec.h"

namespace pipetrain {

// The directory holding the layer files: `dir` itself when it holds a layer_*-model_states.pt,
// else dir/<the tag dir/latest names>. CheckpointError naming `dir` when it is neither.
std::string deepspeed_tag_dir(const std::string& dir);

// One layer file's state dict, in the file's order. CheckpointError naming the file when it
// cannot be read or holds anything but a dict of name -> tensor.
std::vector<std::pair<std::string, torch::Tensor>> read_deepspeed_layer(const std::string& path);

// Loads every layer this rank holds from the DeepSpeed checkpoint in `dir` (a tag directory,
// or its parent with `latest`); not collective. Returns the tag directory read. The step count
// and the optimizer are left as they are. CheckpointError naming the file, the key and the fix
// for a missing file of a layer with parameters, a missing or extra key, or another shape.
std::string load_deepspeed_checkpoint(PipelineEngine& engine, const std::string& dir);

// The same for a model built in one process (layer i of `layers` is global layer begin + i).
std::string load_deepspeed_checkpoint(BuiltLayers& layers, const std::string& dir);

// Writes a pipetrain per-layer checkpoint to `out_dir` (save_checkpoint's format: step 0, no
// optimizer state) from the DeepSpeed checkpoint in `dir`, through a one-stage engine in this
// process (`config`'s pipeline layout is ignored; its optimizer type is recorded). Any layout of
// `module` can then load_checkpoint it, or resume from it.
void convert_deepspeed_checkpoint(PipelineModule module, const std::string& dir, const std::string& out_dir,
                                  EngineConfig config = {});

}  // namespace pipetrain
