// Typed rethrow with context.
#include "pipetrain/util/error_context.h"

#include <c10/util/Exception.h>

#include "pipetrain/error.h"

namespace pipetrain::util {

namespace {

template <typename E>
[[noreturn]] void again(const std::string& context, const E& e) {
  throw E(context + ": " + e.what());
}

}  // namespace

void rethrow_with_context(const std::string& context) {
  // Most derived types first: a catch clause matches base classes too.
  try {
    throw;
  } catch (const ForeignError& e) {
    throw e.with_context(context);
  } catch (const TimeoutError& e) {
    again(context, e);
  } catch (const PeerError& e) {
    again(context, e);
  } catch (const CommError& e) {
    again(context, e);
  } catch (const BalanceError& e) {
    again(context, e);
  } catch (const DeviceError& e) {
    again(context, e);
  } catch (const ConfigError& e) {
    again(context, e);
  } catch (const ModuleError& e) {
    again(context, e);
  } catch (const BatchError& e) {
    again(context, e);
  } catch (const ScheduleError& e) {
    again(context, e);
  } catch (const CheckpointError& e) {
    again(context, e);
  } catch (const DataError& e) {
    again(context, e);
  } catch (const NumericError& e) {
    again(context, e);
  } catch (const UsageError& e) {
    again(context, e);
  } catch (const Error& e) {
    again(context, e);
  } catch (const c10::Error& e) {
    throw Error(context + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error(context + ": " + e.what());
  }
}

}  // namespace pipetrain::util

namespace pipetrain {

ForeignError::ForeignError(std::exception_ptr original, const std::string& what)
    : Error(what), original_(std::move(original)) {}

ForeignError ForeignError::with_context(const std::string& where) const {
  ForeignError out(original_, where + ": " + what());
  out.context_ = context_;
  out.context_.push_back(where);
  return out;
}

}  // namespace pipetrain
