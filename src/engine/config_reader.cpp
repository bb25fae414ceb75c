// The strict JSON object reader behind EngineConfig.
#include "config_reader.h"

#include <algorithm>
#include <sstream>

#include "pipetrain/error.h"

namespace pipetrain::config_detail {

using nlohmann::json;

namespace {

std::string format_number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

ObjectReader::ObjectReader(const json& object, std::string origin)
    : ObjectReader(object, "", std::make_shared<ReadContext>(ReadContext{std::move(origin), {}, {}})) {}

ObjectReader::ObjectReader(const json& object, std::string path, std::shared_ptr<ReadContext> context)
    : object_(object), path_(std::move(path)), context_(std::move(context)) {
  if (!object_.is_object()) {
    fail(path_.empty() ? "the config" : path_, "must be a JSON object, got " + std::string(object_.type_name()));
  }
}

bool ObjectReader::has(const std::string& key) {
  known_.insert(key);
  if (!object_.contains(key) || object_.at(key).is_null()) return false;
  return !(auto_keys_.count(key) && is_auto(key));
}

bool ObjectReader::is_auto(const std::string& key) const {
  return object_.contains(key) && object_.at(key).is_string() && object_.at(key).get<std::string>() == "auto";
}

ObjectReader& ObjectReader::accept_auto(const std::vector<std::string>& keys) {
  auto_keys_.insert(keys.begin(), keys.end());
  return *this;
}

ObjectReader& ObjectReader::ignore(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (!object_.contains(key) || known_.count(key) || !ignored_keys_.insert(key).second) continue;
    if (!(auto_keys_.count(key) && is_auto(key))) context_->ignored.push_back(name(key));
  }
  return *this;
}

void ObjectReader::fail_type(const std::string& key, const std::string& expected) const {
  const json& v = object_.at(key);
  const bool auto_here = v.is_string() && v.get<std::string>() == "auto";
  fail(name(key), "must be " + expected + ", got " + v.dump() +
                      (auto_here ? " (\"auto\" is accepted only where DeepSpeed or the HF Trainer accept it)" : ""));
}

int64_t ObjectReader::integer(const std::string& key, int64_t fallback, int64_t min_value) {
  if (!has(key)) return fallback;
  const json& v = object_.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < min_value) {
    fail_type(key, "an integer >= " + std::to_string(min_value));
  }
  return v.get<int64_t>();
}

double ObjectReader::number(const std::string& key, double fallback, double min_value) {
  if (!has(key)) return fallback;
  const json& v = object_.at(key);
  if (!v.is_number() || v.get<double>() < min_value) fail_type(key, "a number >= " + format_number(min_value));
  return v.get<double>();
}

bool ObjectReader::boolean(const std::string& key, bool fallback) {
  if (!has(key)) return fallback;
  const json& v = object_.at(key);
  if (!v.is_boolean()) fail_type(key, "true or false");
  return v.get<bool>();
}

std::string ObjectReader::string(const std::string& key, const std::string& fallback,
                                 const std::vector<std::string>& allowed) {
  if (!has(key)) return fallback;
  const json& v = object_.at(key);
  if (!v.is_string()) fail_type(key, "a string");
  const auto s = v.get<std::string>();
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
    fail(name(key), "is \"" + s + "\"; expected one of " + join(allowed));
  }
  return s;
}

std::vector<int64_t> ObjectReader::integers(const std::string& key, int64_t min_value) {
  if (!has(key)) return {};
  const json& v = object_.at(key);
  bool ok = v.is_array();
  std::vector<int64_t> out;
  for (size_t i = 0; ok && i < v.size(); ++i) {
    ok = v[i].is_number_integer() && v[i].get<int64_t>() >= min_value;
    if (ok) out.push_back(v[i].get<int64_t>());
  }
  if (!ok) fail_type(key, "a list of integers >= " + std::to_string(min_value));
  return out;
}

std::vector<double> ObjectReader::numbers(const std::string& key, size_t count) {
  const json& v = object_.at(key);
  if (!v.is_array() || v.size() != count ||
      !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number(); })) {
    fail_type(key, "a list of " + std::to_string(count) + " numbers");
  }
  return v.get<std::vector<double>>();
}

ObjectReader ObjectReader::object(const std::string& key) {
  known_.insert(key);
  return ObjectReader(object_.at(key), name(key), context_);
}

std::vector<std::string> ObjectReader::unknown() const {
  std::vector<std::string> out;
  for (const auto& item : object_.items()) {
    if (!known_.count(item.key()) && !ignored_keys_.count(item.key())) out.push_back(name(item.key()));
  }
  return out;
}

void ObjectReader::finish() const {
  const std::vector<std::string> unknown = this->unknown();
  if (unknown.empty()) return;
  // The keys pipetrain reads; the ignored DeepSpeed ones would only bury them.
  const std::vector<std::string> known(known_.begin(), known_.end());
  throw ConfigError(context_->origin + ": unknown key" + (unknown.size() > 1 ? "s " : " ") + quoted(unknown) +
                    (path_.empty() ? "" : " in \"" + path_ + "\"") + "; known keys here: " + join(known) +
                    ". Remove or rename " + (unknown.size() > 1 ? "them" : "it"));
}

void ObjectReader::fail(const std::string& what, const std::string& problem) const {
  throw ConfigError(context_->origin + ": \"" + what + "\" " + problem);
}

std::string ObjectReader::join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

std::string ObjectReader::quoted(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& k : items) out.push_back("\"" + k + "\"");
  return join(out);
}

}  // namespace pipetrain::config_detail
