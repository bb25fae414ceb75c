// Reading environment variables through a lookup function, so parsers can be tested with
// fake environments instead of the process's own.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace pipetrain::comm {

// Returns the value of a variable, or nullopt when it is not set. An empty value counts as
// set (and is then rejected by the parsers that need a number).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real environment of this process (getenv).
EnvLookup process_env();

// A fixed environment, for tests.
EnvLookup fake_env(std::map<std::string, std::string> values);

// Parses an integer variable; ConfigError naming the variable, its value and `fix` when the
// value is not a decimal integer in [min_value, max_value].
int env_int(const EnvLookup& env, const std::string& name, const std::string& fix,
            int min_value = 0, int max_value = 1 << 30);

}  // namespace pipetrain::comm
