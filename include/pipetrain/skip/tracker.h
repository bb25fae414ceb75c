// Skip keys and the tracker where stashed tensors wait for their pop.
//
// A pipeline gives every micro-batch its own tracker and installs it (TrackerScope) while a
// partition runs that micro-batch; skippable layers stash into and pop from the installed one.
// Without a pipeline, layers use a per-thread default tracker, so a model with skips also
// runs as a plain Sequential.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace pipetrain::skip {

// A skip name in a namespace ("" is the default namespace).
struct SkipKey {
  std::string ns;
  std::string name;

  // "'x'" or "'x' in namespace 'down1'", for messages.
  std::string describe() const;
  bool operator<(const SkipKey& o) const { return ns != o.ns ? ns < o.ns : name < o.name; }
  bool operator==(const SkipKey& o) const { return ns == o.ns && name == o.name; }
};

class SkipTracker {
 public:
  // Keeps `tensor` under `key`; a second stash of one key replaces the first.
  void stash(const SkipKey& key, torch::Tensor tensor);
  // Takes the tensor out; ModuleError naming the key when nothing is kept under it.
  torch::Tensor pop(const SkipKey& key);
  bool contains(const SkipKey& key) const { return tensors_.count(key) > 0; }
  size_t size() const { return tensors_.size(); }
  // The keys still waiting for a pop, for messages.
  std::vector<SkipKey> keys() const;
  void clear() { tensors_.clear(); }

 private:
  std::map<SkipKey, torch::Tensor> tensors_;
};

// The tracker installed on this thread, else the thread's default one.
SkipTracker& current_tracker();

// Installs a tracker on this thread for the scope (nests).
class TrackerScope {
 public:
  explicit TrackerScope(SkipTracker& tracker);
  ~TrackerScope();
  TrackerScope(const TrackerScope&) = delete;
  TrackerScope& operator=(const TrackerScope&) = delete;

 private:
  SkipTracker* previous_;
};

}  // namespace pipetrain::skip
