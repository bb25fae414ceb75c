// A stage's skip-link traffic for one step (runtime/skip_links.h): which links start and end
// on each local chunk, the receives posted at the start of the step, sends, and hand-overs
// between chunks of this stage.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "pipetrain/runtime/stage_executor.h"

namespace pipetrain::runtime::detail {

bool needs_grad(const torch::Tensor& t);

// What crosses to another chunk on the same stage: fresh leaves, as if through a channel.
Batch hand_over(const Batch& b);

class SkipTraffic {
 public:
  explicit SkipTraffic(const StageStep& step);

  // Links whose popping (in) or stashing (out) part is local chunk c.
  const std::vector<const SkipLink*>& in_links(int c) const { return in_.at(static_cast<size_t>(c)); }
  const std::vector<const SkipLink*>& out_links(int c) const { return out_.at(static_cast<size_t>(c)); }

  // Posts every receive of the step, each link in its sender's order: the stashing chunk's
  // forwards, and (training) the popping chunk's backwards (B or I).
  void post_receives();
  // The message of link `l` for micro-batch `mb`: its tensors (grad = false) or their gradients.
  Batch receive(const SkipLink& l, int mb, bool grad);
  void send(const SkipLink& l, int mb, bool grad, const Batch& b);

 private:
  using Key = std::tuple<int, int, bool>;  // link, micro-batch, gradients

  const StageStep& s_;
  std::vector<std::vector<const SkipLink*>> in_, out_;
  std::map<Key, comm::RecvHandle> posted_;
  std::map<Key, Batch> local_;
};

}  // namespace pipetrain::runtime::detail
