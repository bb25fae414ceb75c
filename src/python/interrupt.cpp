// run_interruptible: a native call on a helper thread, Python's signal handlers on the main one.
#include "interrupt.h"

#include <ATen/ThreadLocalState.h>
#include <pythread.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>
#include <thread>

namespace pipetrain::python {
namespace {

constexpr std::chrono::milliseconds kPoll{100};
// How long a cancelled work may take to stop before it is abandoned: a Python layer inside one
// long C call (time.sleep(600)) sees the exception only when that call returns.
constexpr std::chrono::milliseconds kGrace{10'000};

struct Call {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::function<void()> work;
};

unsigned long main_thread_ident() {
  static const unsigned long ident =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  return ident;
}

// Raises `type` in the Python code run by threads that are not the script's own: pipetrain's
// native workers (their layers, losses, iterators) and the helper. Threads made with
// threading.Thread belong to the script and are left alone.
void interrupt_native_python(PyObject* type) {
  py::dict frames = py::module_::import("sys").attr("_current_frames")();
  py::object threading = py::module_::import("threading");
  py::object active = threading.attr("_active");
  py::object dummy = threading.attr("_DummyThread");
  const unsigned long self = PyThread_get_thread_ident();
  for (auto item : frames) {
    const auto ident = item.first.cast<unsigned long>();
    if (ident == self) continue;
    py::object known = active.attr("get")(item.first, py::none());
    if (!known.is_none() && !py::isinstance(known, dummy)) continue;
    PyThreadState_SetAsyncExc(ident, type);
  }
}

// Waits up to `d` for the work to end, with the GIL released.
bool wait_done(Call& call, std::chrono::milliseconds d) {
  py::gil_scoped_release release;
  std::unique_lock<std::mutex> lock(call.mu);
  return call.cv.wait_for(lock, d, [&] { return call.done; });
}

}  // namespace

void run_interruptible(std::function<void()> work, const std::function<void()>& cancel) {
  if (PyThread_get_thread_ident() != main_thread_ident()) {
    py::gil_scoped_release release;
    work();
    return;
  }
  auto call = std::make_shared<Call>();
  call->work = std::move(work);
  std::thread helper([call, state = at::ThreadLocalState()] {
    at::ThreadLocalStateGuard guard(state);
    std::exception_ptr error;
    try {
      call->work();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(call->mu);
    call->done = true;
    call->error = error;
    call->cv.notify_all();
  });
  bool signalled = false;
  while (!wait_done(*call, kPoll)) {
    if (PyErr_CheckSignals() != 0) {
      signalled = true;
      break;
    }
  }
  if (!signalled) {
    helper.join();
    if (call->error) {
      // A peer's interrupt can end the work before this rank's own handler has run: the launcher
      // (or the terminal) signals every rank, the first to notice tells the others. A signal
      // already delivered here wins over the error it caused.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      std::rethrow_exception(call->error);
    }
    return;
  }
  py::error_already_set signal_error;  // the handler's exception: KeyboardInterrupt on Ctrl-C
  if (cancel) {
    py::gil_scoped_release release;
    try {
      cancel();
    } catch (const std::exception& e) {
      std::cerr << "pipetrain: stopping the peers after the interrupt failed: " << e.what() << std::endl;
    }
  }
  interrupt_native_python(signal_error.type().ptr());
  // The work's own error (the interrupted waits') is a consequence of the signal: the signal's
  // exception is the one raised. A second signal stops waiting at once.
  const auto give_up = std::chrono::steady_clock::now() + kGrace;
  bool stopped = false;
  while (!(stopped = wait_done(*call, kPoll)) && std::chrono::steady_clock::now() < give_up) {
    if (PyErr_CheckSignals() != 0) {
      PyErr_Clear();
      break;
    }
  }
  if (stopped) {
    helper.join();
  } else {
    std::cerr << "pipetrain: the interrupted native call did not stop within "
              << std::chrono::duration_cast<std::chrono::seconds>(kGrace).count()
              << " s (a Python layer inside a long C call?); leaving it behind" << std::endl;
    helper.detach();
  }
  throw signal_error;
}

}  // namespace pipetrain::python
