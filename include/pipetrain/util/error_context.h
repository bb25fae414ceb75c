// Adding "where" to an error on its way out, without losing its type.
#pragma once

#include <exception>
#include <string>

namespace pipetrain::util {

// Rethrows the exception in flight with `context + ": "` before its message, as the same
// pipetrain error type (so callers can still catch TimeoutError, PeerError, ...). Anything that
// is not a pipetrain::Error (a LibTorch error inside a layer) becomes a pipetrain::Error with
// LibTorch's message minus its C++ backtrace. Call only inside a catch block.
[[noreturn]] void rethrow_with_context(const std::string& context);

}  // namespace pipetrain::util
