// GPipe's model checks and the split of a Sequential into partitions by a balance.
#include <set>
#include <unordered_map>

#include "pipetrain/engine/gpipe.h"
#include "pipetrain/error.h"

namespace pipetrain {
namespace {

std::string list_to_string(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t k = 0; k < values.size(); ++k) out += (k ? ", " : "") + std::to_string(values[k]);
  return out + "]";
}

// torchgpipe's recommend_auto_balance, for our API.
std::string recommend_auto_balance(const std::string& message) {
  return message +
         ". If the model is still changing, compute the balance instead of writing it: "
         "pipetrain::balance_by_time(partitions, model, sample), balance_by_size(partitions, "
         "model, sample) or balance_by_params(partitions, model) (pipetrain/partition/balance.h)";
}

}  // namespace

void verify_module(const torch::nn::Sequential& module) {
  const auto children = module->named_children();
  std::unordered_map<const torch::nn::Module*, std::string> seen;
  for (const auto& child : children) {
    auto [it, fresh] = seen.emplace(child.value().get(), child.key());
    if (!fresh) {
      throw ModuleError("the model has the same module twice, as children '" + it->second +
                        "' and '" + child.key() +
                        "'; GPipe needs distinct children (a layer can live in one partition "
                        "only). Use a separate module for each position, e.g. clone() it");
    }
  }
  std::unordered_map<const c10::TensorImpl*, std::string> owner;
  for (const auto& child : children) {
    for (const auto& p : child.value()->named_parameters()) {
      auto [it, fresh] = owner.emplace(p.value().unsafeGetTensorImpl(), child.key());
      if (!fresh && it->second != child.key()) {
        throw ModuleError("parameter '" + p.key() + "' of child '" + child.key() +
                          "' is also a parameter of child '" + it->second +
                          "'; GPipe does not support parameters shared between distinct "
                          "children (they may land in different partitions). Put the layers "
                          "that share it into one child module");
      }
    }
  }
}

std::vector<runtime::Stage> split_module(const torch::nn::Sequential& module,
                                         const std::vector<int64_t>& balance,
                                         std::vector<torch::Device>& devices) {
  const auto layers = static_cast<int64_t>(module->size());
  int64_t sum = 0;
  for (int64_t b : balance) sum += b;
  if (sum != layers) {
    throw BalanceError(recommend_auto_balance(
        "the model has " + std::to_string(layers) + " layers but the balance " +
        list_to_string(balance) + " sums to " + std::to_string(sum) +
        "; the balance must give every layer to one partition (module: " +
        std::to_string(layers) + ", sum of balance: " + std::to_string(sum) + ")"));
  }
  for (int64_t b : balance) {
    if (b <= 0) {
      throw BalanceError(recommend_auto_balance(
          "every balance entry must be a positive number of layers, got " +
          list_to_string(balance)));
    }
  }
  if (balance.size() > devices.size()) {
    throw DeviceError("too few devices to hold the partitions (devices: " +
                      std::to_string(devices.size()) + ", partitions: " +
                      std::to_string(balance.size()) +
                      "); pass one device per partition with GPipeOptions::devices, or use a "
                      "balance with fewer partitions");
  }
  devices.erase(devices.begin() + static_cast<std::ptrdiff_t>(balance.size()), devices.end());

  const auto named = module->named_children();
  std::vector<runtime::Stage> stages;
  int64_t next = 0;
  for (size_t j = 0; j < balance.size(); ++j) {
    runtime::Stage stage;
    stage.index = static_cast<int64_t>(j);
    stage.first_layer = next;
    stage.device = devices[j];
    for (int64_t k = 0; k < balance[j]; ++k, ++next) {
      stage.layers->push_back(named[next].key(), module->begin()[next]);
    }
    stage.layers->to(stage.device);
    stages.push_back(std::move(stage));
  }
  return stages;
}

}  // namespace pipetrain
