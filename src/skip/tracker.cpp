// Skip keys and the per-micro-batch tracker of stashed tensors.
#include "pipetrain/skip/tracker.h"

#include "pipetrain/error.h"

namespace pipetrain::skip {
namespace {

thread_local SkipTracker* installed_ = nullptr;

SkipTracker& default_tracker() {
  thread_local SkipTracker tracker;
  return tracker;
}

}  // namespace

std::string SkipKey::describe() const {
  return ns.empty() ? "'" + name + "'" : "'" + name + "' in namespace '" + ns + "'";
}

void SkipTracker::stash(const SkipKey& key, torch::Tensor tensor) {
  tensors_[key] = std::move(tensor);
}

torch::Tensor SkipTracker::pop(const SkipKey& key) {
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    std::string waiting;
    for (const auto& [k, t] : tensors_) waiting += (waiting.empty() ? "" : ", ") + k.describe();
    throw ModuleError("skip " + key.describe() + " is popped but nothing was stashed under it" +
                      (waiting.empty() ? std::string() : " (waiting: " + waiting + ")") +
                      "; a layer before the pop must stash it in the same forward");
  }
  torch::Tensor t = std::move(it->second);
  tensors_.erase(it);
  return t;
}

std::vector<SkipKey> SkipTracker::keys() const {
  std::vector<SkipKey> out;
  for (const auto& [k, t] : tensors_) out.push_back(k);
  return out;
}

SkipTracker& current_tracker() { return installed_ ? *installed_ : default_tracker(); }

TrackerScope::TrackerScope(SkipTracker& tracker) : previous_(installed_) { installed_ = &tracker; }
TrackerScope::~TrackerScope() { installed_ = previous_; }

}  // namespace pipetrain::skip
