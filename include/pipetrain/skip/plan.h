// A model's skips checked and routed: which layer stashes each key and which layer pops it,
// and what a range of layers (a partition, a checkpointed group) takes in and gives out.
//
//   layers:   0 stash(a)   1   2 stash(b)   3 pop(b)   4   5 pop(a)
//   ranges:   [0, 2)                 [2, 4)                [4, 6)
//   range [2, 4): pops_in = {}, stashes_out = {}   (b stays inside)
//   range [4, 6): pops_in = {a from layer 0}       range [0, 2): stashes_out = {a to layer 5}
//
// A range's pops_in arrive with its input and its stashes_out leave with its output, so a
// pipeline moves each stashed tensor straight from the partition that stashes it to the one
// that pops it, and a checkpointed range can treat them as extra inputs and outputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/skip/skippable.h"

namespace pipetrain::skip {

struct SkipRoute {
  SkipKey key;
  int64_t stash_layer = 0;
  int64_t pop_layer = 0;
};

class SkipPlan {
 public:
  SkipPlan() = default;
  // Checks the declarations of a model's layers in order (`names[i]` names layer i in
  // messages): every pop has exactly one earlier stash, every stash is popped by a later
  // layer, a key is stashed once and popped once, a layer does not pop what it stashes.
  // ModuleError naming the key and the layers otherwise.
  SkipPlan(const std::vector<SkipDeclaration>& layers, const std::vector<std::string>& names);

  bool empty() const { return routes_.empty(); }
  const std::vector<SkipRoute>& routes() const { return routes_; }

  // Routes popped in [first, last) and stashed before `first`, by pop layer.
  std::vector<SkipRoute> pops_in(int64_t first, int64_t last) const;
  // Routes stashed in [first, last) and popped at or after `last`, by stash layer.
  std::vector<SkipRoute> stashes_out(int64_t first, int64_t last) const;

 private:
  std::vector<SkipRoute> routes_;  // by stash layer
};

// The declarations of a Sequential's layers (empty for layers that are not Skippable).
// ModuleError when a Skippable sits inside another layer: only the Sequential's own layers
// can be placed on partitions.
std::vector<SkipDeclaration> declarations_of(const torch::nn::Sequential& model);

}  // namespace pipetrain::skip
