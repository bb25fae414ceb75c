// Small POSIX socket helpers for the rendezvous probe and the peer monitor.
#pragma once

#include <chrono>
#include <string>
#include <utility>

namespace pipetrain::comm::detail {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// Listens on host:0 (an ephemeral port); returns the socket and the port.
std::pair<Fd, int> listen_ephemeral(const std::string& host);

// Connects to host:port, retrying every few milliseconds until `deadline` (the peer may not
// be listening yet). Returns an invalid Fd when the deadline passes.
Fd connect_until(const std::string& host, int port, Clock::time_point deadline);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// Writes all of `data` (blocking socket), false on error.
bool write_all(int fd, const void* data, size_t size);
// Reads exactly `size` bytes before `deadline`, false on error, EOF or timeout.
bool read_exact(int fd, void* data, size_t size, Clock::time_point deadline);

}  // namespace pipetrain::comm::detail
