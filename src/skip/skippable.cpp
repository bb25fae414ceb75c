// Skippable layers: declarations, namespaces, and the stash/pop handed to their forward.
#include "pipetrain/skip/skippable.h"

#include <algorithm>
#include <atomic>

#include "pipetrain/error.h"

namespace pipetrain::skip {
namespace {

std::vector<SkipKey> keys_of(const std::vector<std::string>& names) {
  std::vector<SkipKey> keys;
  for (const auto& n : names) {
    if (n.empty()) throw ModuleError("a skip name must not be empty; name each stashed tensor");
    keys.push_back({"", n});
  }
  return keys;
}

std::string list(const std::vector<SkipKey>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    out += (i ? ", " : "") + (keys[i].ns.empty() ? keys[i].name : keys[i].ns + "/" + keys[i].name);
  }
  return out + "]";
}

}  // namespace

Namespace::Namespace() {
  static std::atomic<int64_t> counter{0};
  name_ = "ns" + std::to_string(++counter);
}

Namespace::Namespace(std::string name) : name_(std::move(name)) {
  if (name_.empty()) throw ModuleError("a skip Namespace needs a non-empty name (\"\" is the default namespace)");
}

SkipDeclaration SkipDeclaration::of(const std::vector<std::string>& stash,
                                    const std::vector<std::string>& pop) {
  return {keys_of(stash), keys_of(pop)};
}

SkipDeclaration SkipDeclaration::isolated(const Namespace& ns) const {
  SkipDeclaration out = *this;
  for (auto& k : out.stash) k.ns = ns.name();
  for (auto& k : out.pop) k.ns = ns.name();
  return out;
}

std::string SkipDeclaration::describe() const {
  return "stash " + list(stash) + ", pop " + list(pop);
}

bool SkipDeclaration::operator==(const SkipDeclaration& other) const {
  // Python declares names as sets, whose iteration order follows PYTHONHASHSEED: compare sorted.
  const auto sorted = [](std::vector<SkipKey> keys) {
    std::sort(keys.begin(), keys.end());
    return keys;
  };
  return sorted(stash) == sorted(other.stash) && sorted(pop) == sorted(other.pop);
}

const SkipKey& Skips::key(const std::vector<SkipKey>& keys, const std::string& name,
                          const char* what) const {
  for (const auto& k : keys) {
    if (k.name == name) return k;
  }
  throw ModuleError("layer " + layer_.layer_name() + " " + what + " skip '" + name +
                    "' but declares " + layer_.declaration().describe() +
                    "; add the name to its declaration");
}

void Skips::stash(const std::string& name, torch::Tensor tensor) {
  // An undefined tensor is a valid stash (torchgpipe's None): an optional skip. It travels to
  // the popping layer like any other, which decides what to do without it.
  const SkipKey& k = key(layer_.declaration().stash, name, "stashes");
  tracker_.stash(k, std::move(tensor));
  stashed_.push_back(k);
}

torch::Tensor Skips::pop(const std::string& name) {
  const SkipKey& k = key(layer_.declaration().pop, name, "pops");
  torch::Tensor t = tracker_.pop(k);
  popped_.push_back(k);
  return t;
}

namespace {

// "'a', 'b'" for the keys of `declared` missing from `used`.
std::string missing(const std::vector<SkipKey>& declared, const std::vector<SkipKey>& used) {
  std::string out;
  for (const auto& k : declared) {
    if (std::find(used.begin(), used.end(), k) != used.end()) continue;
    out += (out.empty() ? "" : ", ") + k.describe();
  }
  return out;
}

}  // namespace

void Skips::check_all_used() {
  const auto& declared = layer_.declaration();
  const std::string not_stashed = missing(declared.stash, stashed_);
  if (!not_stashed.empty()) {
    throw ModuleError(not_stashed + " must be stashed but have not: layer " + layer_.layer_name() +
                      " declares " + declared.describe() +
                      " but its forward did not stash them; stash each declared name in every forward "
                      "(an undefined tensor for an optional skip) or drop it from the declaration");
  }
  const std::string not_popped = missing(declared.pop, popped_);
  if (!not_popped.empty()) {
    // A skip nobody will take must not linger in the tracker for the next forward.
    for (const auto& k : declared.pop) {
      if (std::find(popped_.begin(), popped_.end(), k) == popped_.end() && tracker_.contains(k)) tracker_.pop(k);
    }
    throw ModuleError(not_popped + " must be popped but have not: layer " + layer_.layer_name() + " declares " +
                      declared.describe() +
                      " but its forward did not pop them; pop each declared name in every forward or drop it "
                      "from the declaration");
  }
}

SkippableImpl::SkippableImpl(std::vector<std::string> stash, std::vector<std::string> pop,
                             Body body, std::string name)
    : SkippableImpl(std::move(stash), std::move(pop), std::move(name)) {
  if (!body) throw ModuleError("Skippable " + name_ + " needs a body function");
  body_ = std::move(body);
}

SkippableImpl::SkippableImpl(std::vector<std::string> stash, std::vector<std::string> pop,
                             std::string name)
    : declaration_(SkipDeclaration::of(stash, pop)), name_(std::move(name)) {}

SkippableImpl::SkippableImpl(SkipDeclaration declaration, std::string name)
    : declaration_(std::move(declaration)), name_(std::move(name)) {}

SkippableImpl& SkippableImpl::isolate(const Namespace& ns) {
  declaration_ = declaration_.isolated(ns);
  return *this;
}

torch::Tensor SkippableImpl::forward(const torch::Tensor& input) {
  Skips skips(*this, current_tracker());
  torch::Tensor output = forward_skips(input, skips);
  skips.check_all_used();
  return output;
}

torch::Tensor SkippableImpl::forward_skips(const torch::Tensor& input, Skips& skips) {
  if (!body_) {
    throw ModuleError("Skippable " + name_ + " has no body: pass one, or override forward_skips");
  }
  return body_(input, skips);
}

void SkippableImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::skip::" << name_ << "(" << declaration_.describe() << ")";
}

std::shared_ptr<torch::nn::Module> SkippableImpl::clone(const torch::optional<torch::Device>& device) const {
  if (typeid(*this) != typeid(SkippableImpl)) return torch::nn::Module::clone(device);
  return std::make_shared<SkippableImpl>(*this);  // a Body-based skippable holds no tensors
}

Skippable stash(const std::string& name) {
  return Skippable(std::vector<std::string>{name}, std::vector<std::string>{},
                   [name](const torch::Tensor& x, Skips& s) {
                     s.stash(name, x);
                     return x;
                   },
                   "Stash");
}

Skippable pop_add(const std::string& name) {
  return Skippable(std::vector<std::string>{}, std::vector<std::string>{name},
                   [name](const torch::Tensor& x, Skips& s) {
                     torch::Tensor skipped = s.pop(name);
                     return skipped.defined() ? x + skipped : x;  // an optional skip adds nothing
                   },
                   "PopAdd");
}

Skippable pop_cat(const std::string& name, int64_t dim) {
  return Skippable(std::vector<std::string>{}, std::vector<std::string>{name},
                   [name, dim](const torch::Tensor& x, Skips& s) {
                     torch::Tensor skipped = s.pop(name);
                     // Concatenating nothing would change the output's width: the next layer
                     // would fail far from the cause.
                     if (!skipped.defined()) {
                       throw ModuleError("PopCat popped an undefined tensor under skip '" + name +
                                         "' and cannot concatenate it; stash a tensor, or pop it "
                                         "in a Skippable that handles the missing one");
                     }
                     return torch::cat({x, skipped}, dim);
                   },
                   "PopCat");
}

Skippable stash(const std::string& name, const Namespace& ns) {
  Skippable s = stash(name);
  s->isolate(ns);
  return s;
}

Skippable pop_add(const std::string& name, const Namespace& ns) {
  Skippable s = pop_add(name);
  s->isolate(ns);
  return s;
}

Skippable pop_cat(const std::string& name, const Namespace& ns, int64_t dim) {
  Skippable s = pop_cat(name, dim);
  s->isolate(ns);
  return s;
}

std::shared_ptr<SkippableImpl> as_skippable(const std::shared_ptr<torch::nn::Module>& module) {
  return std::dynamic_pointer_cast<SkippableImpl>(module);
}

}  // namespace pipetrain::skip
