// Reading environment variables through a lookup function (real or fake).
#include "pipetrain/comm/env.h"

#include <cerrno>
#include <cstdlib>

#include "pipetrain/error.h"

namespace pipetrain::comm {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup fake_env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

int env_int(const EnvLookup& env, const std::string& name, const std::string& fix,
            int min_value, int max_value) {
  const auto value = env(name);
  if (!value) {
    throw ConfigError("environment variable " + name + " is not set; " + fix);
  }
  const std::string& text = *value;
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  const bool whole = !text.empty() && end != nullptr && *end == '\0';
  if (!whole || errno == ERANGE || parsed < min_value || parsed > max_value) {
    throw ConfigError("environment variable " + name + "='" + text +
                      "' is not an integer in [" + std::to_string(min_value) + ", " +
                      std::to_string(max_value) + "]; " + fix);
  }
  return static_cast<int>(parsed);
}

}  // namespace pipetrain::comm
