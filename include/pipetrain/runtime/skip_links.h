// Skip links: the skip traffic between two parts (virtual stages) of an engine's model.
//
// Every key stashed on virtual stage s and popped on a later virtual stage d travels in the
// link (s, d): one message per micro-batch holding the link's tensors in key order, sent by s
// right after its forward, and one message of their gradients sent back by d right after its
// backward, one value per key. Both may hold none (comm/message_header.h): a key whose
// optional skip stashed an undefined tensor, a gradient of a value that needs none. Keys
// stashed and popped on one virtual stage need no link.
//
// Links never add a wait to a valid schedule: d's forward of micro-batch i already waits for
// s's forward of i (through the activations of s+1 .. d-1), and s's backward of i for d's.
#pragma once

#include <cstdint>
#include <vector>

#include "pipetrain/skip/plan.h"

namespace pipetrain::runtime {

struct SkipLink {
  int id = 0;           // the link's stream number, the same on every rank
  int src_virtual = 0;  // the virtual stage that stashes
  int dst_virtual = 0;  // the virtual stage that pops
  std::vector<skip::SkipKey> keys;
};

// The links of `plan` for a model cut at `offsets` (first layer of each virtual stage, then the
// layer count), ordered by (src, dst). ConfigError when there are more links than streams.
std::vector<SkipLink> skip_links(const skip::SkipPlan& plan, const std::vector<int64_t>& offsets);

}  // namespace pipetrain::runtime
