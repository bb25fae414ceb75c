// The typed exceptions of pipetrain: every user-facing failure is one of these.
//
// A message names the value seen, the value expected and the fix; distributed errors also
// name the rank, stage, micro-batch and action. Catch `pipetrain::Error` for all of them.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipetrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A user-supplied setting is wrong: options, balance, config file, command-line argument.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// The balance does not fit the model (sum != number of layers, an entry <= 0).
class BalanceError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// Too few devices for the partitions, or a device the runtime cannot use.
class DeviceError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// The model cannot be pipelined as given (duplicate children, parameters shared between
// children, a bad skip declaration).
class ModuleError : public Error {
 public:
  using Error::Error;
};

// A micro-batch or stage boundary value is wrong (undefined tensor, unexpected shape/dtype).
class BatchError : public Error {
 public:
  using Error::Error;
};

// A schedule is malformed or cannot be generated for the given parameters.
class ScheduleError : public Error {
 public:
  using Error::Error;
};

// Moving tensors between stages failed.
class CommError : public Error {
 public:
  using Error::Error;
};

// A blocking wait ran past its timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A peer process died or closed its connection.
class PeerError : public CommError {
 public:
  using CommError::CommError;
};

// A checkpoint cannot be written or read (missing, truncated, bad checksum, wrong layout).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// The data source is wrong: an iterator that runs out mid-batch, a missing or corrupt file.
class DataError : public Error {
 public:
  using Error::Error;
};

// A loss or gradient that is NaN or infinite.
class NumericError : public Error {
 public:
  using Error::Error;
};

// The API was used in a way it does not support (e.g. engine.forward instead of train_batch).
class UsageError : public Error {
 public:
  using Error::Error;
};

// An exception raised by code in another language (a layer, loss or data iterator written in
// Python), carried through the runtime as it was raised so that its caller gets it back with its
// own type and traceback. `original()` is that exception; where it passed on its way out
// ("stage 1, action 1F3") is kept apart in `context()` instead of being prepended to a message.
class ForeignError : public Error {
 public:
  ForeignError(std::exception_ptr original, const std::string& what);
  std::exception_ptr original() const { return original_; }
  const std::vector<std::string>& context() const { return context_; }
  // The same error with `where` added outermost.
  ForeignError with_context(const std::string& where) const;

 private:
  std::exception_ptr original_;
  std::vector<std::string> context_;
};

}  // namespace pipetrain
