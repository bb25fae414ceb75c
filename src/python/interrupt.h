// Native calls that Ctrl-C stops: the work runs on a helper thread with the GIL released while
// Python's main thread runs the signal handlers every 100 ms, so a KeyboardInterrupt reaches
// the user within about a second instead of when the native call ends.
#pragma once

#include <torch/extension.h>

#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace pipetrain::python {

// Runs `work` with the GIL released (call it with the GIL held). On Python's main thread the
// work runs on a helper thread (with this thread's autograd and dispatch state) while this one
// runs the signal handlers every 100 ms. When a handler raises (KeyboardInterrupt on Ctrl-C):
// `cancel` is called (it makes the work's waits fail at once and tells the peers:
// Communicator::interrupt), Python code running on pipetrain's native threads gets the same
// exception, the work is given a few seconds to stop, and the handler's exception is raised
// here. Off the main thread no handler can run: `work` runs inline. `work` must own what it
// uses (captured by value), since a work that does not stop in time is abandoned.
void run_interruptible(std::function<void()> work, const std::function<void()>& cancel);

// The same for a work that returns a value.
template <typename F>
auto interruptible(F work, const std::function<void()>& cancel) -> decltype(work()) {
  using T = decltype(work());
  if constexpr (std::is_void_v<T>) {
    run_interruptible(std::move(work), cancel);
  } else {
    auto result = std::make_shared<std::optional<T>>();
    run_interruptible([result, work = std::move(work)]() mutable { result->emplace(work()); }, cancel);
    return std::move(**result);
  }
}

}  // namespace pipetrain::python
