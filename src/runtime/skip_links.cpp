// Grouping a model's skip routes into links between virtual stages.
#include "pipetrain/runtime/skip_links.h"

#include <algorithm>
#include <map>

#include "pipetrain/comm/channel.h"
#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

int part_of(const std::vector<int64_t>& offsets, int64_t layer) {
  auto it = std::upper_bound(offsets.begin(), offsets.end(), layer);
  return static_cast<int>(it - offsets.begin()) - 1;
}

}  // namespace

std::vector<SkipLink> skip_links(const skip::SkipPlan& plan, const std::vector<int64_t>& offsets) {
  std::map<std::pair<int, int>, std::vector<skip::SkipKey>> by_pair;
  for (const auto& r : plan.routes()) {
    const int s = part_of(offsets, r.stash_layer);
    const int d = part_of(offsets, r.pop_layer);
    if (s != d) by_pair[{s, d}].push_back(r.key);
  }
  std::vector<SkipLink> links;
  for (auto& [pair, keys] : by_pair) {
    const int id = static_cast<int>(links.size());
    if (id >= comm::kMaxChunks) {
      throw ConfigError("the model's skips connect " + std::to_string(by_pair.size()) +
                        " pairs of pipeline parts, more than the " + std::to_string(comm::kMaxChunks) +
                        " skip streams; use fewer stages or fewer long skips");
    }
    links.push_back({id, pair.first, pair.second, std::move(keys)});
  }
  return links;
}

}  // namespace pipetrain::runtime
