// Checking a model's skip declarations and routing each key from its stash to its pop.
#include "pipetrain/skip/plan.h"

#include <algorithm>
#include <map>

#include "pipetrain/error.h"

namespace pipetrain::skip {
namespace {

std::string layer(const std::vector<std::string>& names, int64_t i) {
  const auto n = static_cast<size_t>(i);
  return "layer " + std::to_string(i) + (n < names.size() && !names[n].empty() ? " (" + names[n] + ")" : "");
}

}  // namespace

SkipPlan::SkipPlan(const std::vector<SkipDeclaration>& layers, const std::vector<std::string>& names) {
  std::map<SkipKey, int64_t> stashed;  // key -> its stash layer, until popped
  std::map<SkipKey, int64_t> popped;   // key -> its pop layer
  std::map<SkipKey, int64_t> stash_layer;
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i) {
    const auto& decl = layers[static_cast<size_t>(i)];
    for (const auto& k : decl.pop) {
      if (std::count(decl.pop.begin(), decl.pop.end(), k) > 1) {
        throw ModuleError(layer(names, i) + " declares the pop of skip " + k.describe() + " twice");
      }
      if (std::find(decl.stash.begin(), decl.stash.end(), k) != decl.stash.end()) {
        throw ModuleError(layer(names, i) + " both stashes and pops skip " + k.describe() +
                          "; a skip goes from one layer to a later one");
      }
      auto p = popped.find(k);
      if (p != popped.end()) {
        throw ModuleError("skip " + k.describe() + " is popped by " + layer(names, p->second) + " and again by " +
                          layer(names, i) + "; each stash has exactly one pop (stash it twice under two names)");
      }
      auto s = stashed.find(k);
      if (s == stashed.end()) {
        // Name the later stash when there is one: the order is wrong, not the name.
        for (int64_t j = i + 1; j < static_cast<int64_t>(layers.size()); ++j) {
          const auto& later = layers[static_cast<size_t>(j)].stash;
          if (std::find(later.begin(), later.end(), k) != later.end()) {
            throw ModuleError(layer(names, i) + " pops skip " + k.describe() + " before " + layer(names, j) +
                              " stashes it; a pop must come after its stash");
          }
        }
        throw ModuleError(layer(names, i) + " pops skip " + k.describe() +
                          " but no layer stashes it; declare the stash on an earlier layer (same namespace)");
      }
      routes_.push_back({k, s->second, i});
      popped[k] = i;
      stashed.erase(s);
    }
    for (const auto& k : decl.stash) {
      auto prev = stash_layer.find(k);
      if (prev != stash_layer.end()) {
        throw ModuleError("skip " + k.describe() + " is stashed by " + layer(names, prev->second) +
                          " and again by " + layer(names, i) +
                          "; give a repeated block its own skip::Namespace (isolate) or rename one");
      }
      stash_layer[k] = i;
      stashed[k] = i;
    }
  }
  if (!stashed.empty()) {
    const auto& [k, i] = *stashed.begin();
    throw ModuleError(layer(names, i) + " stashes skip " + k.describe() +
                      " but no later layer pops it; pop it, or drop the stash");
  }
  std::stable_sort(routes_.begin(), routes_.end(),
                   [](const SkipRoute& a, const SkipRoute& b) { return a.stash_layer < b.stash_layer; });
}

std::vector<SkipRoute> SkipPlan::pops_in(int64_t first, int64_t last) const {
  std::vector<SkipRoute> out;
  for (const auto& r : routes_) {
    if (r.pop_layer >= first && r.pop_layer < last && r.stash_layer < first) out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const SkipRoute& a, const SkipRoute& b) { return a.pop_layer < b.pop_layer; });
  return out;
}

std::vector<SkipRoute> SkipPlan::stashes_out(int64_t first, int64_t last) const {
  std::vector<SkipRoute> out;
  for (const auto& r : routes_) {
    if (r.stash_layer >= first && r.stash_layer < last && r.pop_layer >= last) out.push_back(r);
  }
  return out;
}

std::vector<SkipDeclaration> declarations_of(const torch::nn::Sequential& model) {
  std::vector<SkipDeclaration> out;
  int64_t i = 0;
  for (const auto& layer : *model) {
    auto top = as_skippable(layer.ptr());
    out.push_back(top ? top->declaration() : SkipDeclaration());
    for (const auto& inner : layer.ptr()->modules(/*include_self=*/false)) {
      if (auto nested = as_skippable(inner)) {
        throw ModuleError("layer " + std::to_string(i) + " holds the skippable " + nested->layer_name() + " (" +
                          nested->declaration().describe() +
                          ") inside it; skippable layers must be direct children of the Sequential");
      }
    }
    ++i;
  }
  return out;
}

}  // namespace pipetrain::skip
