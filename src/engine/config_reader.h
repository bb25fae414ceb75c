// The strict JSON object reader behind EngineConfig: typed getters, "auto" where DeepSpeed
// allows it, DeepSpeed keys that are accepted but ignored, and an error naming unknown keys.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace pipetrain::config_detail {

// What all readers of one document share: its name (for messages), the dotted names of the
// keys they ignored (for the one warning that lists them) and other warnings.
struct ReadContext {
  std::string origin;
  std::vector<std::string> ignored;
  std::vector<std::string> warnings;
};

class ObjectReader {
 public:
  // The document itself (path "").
  ObjectReader(const nlohmann::json& object, std::string origin);

  // Marks `key` as understood; true when present, not null and not an accepted "auto".
  bool has(const std::string& key);
  const nlohmann::json& value(const std::string& key) const { return object_.at(key); }
  // The value is the string "auto" (accepted or not).
  bool is_auto(const std::string& key) const;

  // DeepSpeed and HF Trainer write "auto" for these keys, meaning "derive it"; here it means
  // what leaving the key out means.
  ObjectReader& accept_auto(const std::vector<std::string>& keys);
  // Keys DeepSpeed knows that pipetrain does not implement: accepted whatever their value, and
  // listed in ignored() unless they are an accepted "auto" (which asks for nothing).
  ObjectReader& ignore(const std::vector<std::string>& keys);
  // A warning about this document, prefixed with its name.
  void warn(const std::string& message) { context_->warnings.push_back(context_->origin + ": " + message); }

  int64_t integer(const std::string& key, int64_t fallback, int64_t min_value);
  double number(const std::string& key, double fallback, double min_value);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback,
                     const std::vector<std::string>& allowed = {});
  std::vector<int64_t> integers(const std::string& key, int64_t min_value);
  std::vector<double> numbers(const std::string& key, size_t count);
  ObjectReader object(const std::string& key);

  // Every key neither read nor ignored is an error: DeepSpeed silently ignores typos, we do not.
  void finish() const;
  // The keys neither read nor ignored so far (dotted names), for a caller that tolerates them.
  std::vector<std::string> unknown() const;
  // The dotted names of the ignored keys of every reader of this document, in reading order.
  const std::vector<std::string>& ignored() const { return context_->ignored; }
  const std::vector<std::string>& warnings() const { return context_->warnings; }
  const std::string& origin() const { return context_->origin; }

  [[noreturn]] void fail(const std::string& what, const std::string& problem) const;
  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  static std::string join(const std::vector<std::string>& items);
  static std::string quoted(const std::vector<std::string>& items);

 private:
  ObjectReader(const nlohmann::json& object, std::string path, std::shared_ptr<ReadContext> context);
  [[noreturn]] void fail_type(const std::string& key, const std::string& expected) const;

  const nlohmann::json& object_;
  std::string path_;
  std::shared_ptr<ReadContext> context_;
  std::set<std::string> known_;
  std::set<std::string> auto_keys_;
  std::set<std::string> ignored_keys_;
};

}  // namespace pipetrain::config_detail
