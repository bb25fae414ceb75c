// Liveness of the other ranks: heartbeats, goodbyes and failure reasons over TCP.
#include "peer_monitor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "pipetrain/error.h"

namespace pipetrain::comm::detail {
namespace {

constexpr size_t kMaxReason = 4096;

std::string key_of(int rank) { return "monitor/" + std::to_string(rank); }

std::string as_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

}  // namespace

PeerMonitor::PeerMonitor(c10d::Store& store, int rank, int world_size,
                         const std::string& bind_address, const CommOptions& options,
                         std::shared_ptr<FaultState> faults)
    : rank_(rank), options_(options), faults_(std::move(faults)) {
  const auto deadline = Clock::now() + options.connect_timeout();
  const RankNamer& name = options.rank_namer();
  auto [listener, port] = listen_ephemeral(bind_address);
  const std::string address = bind_address + " " + std::to_string(port);
  store.set(key_of(rank), std::vector<uint8_t>(address.begin(), address.end()));

  // Connect to every higher rank (their listeners exist before their keys), then accept the
  // lower ones: connects complete in the peers' backlog, so no order can deadlock.
  for (int peer = rank + 1; peer < world_size; ++peer) {
    try {
      store.wait({key_of(peer)}, options.connect_timeout());
    } catch (const std::exception& e) {
      throw TimeoutError(name(rank) + ": " + name(peer) + " did not join within " +
                         format_duration(options.connect_timeout()) +
                         " (liveness monitor); start every rank, or raise the connect timeout");
    }
    const std::string value = as_string(store.get(key_of(peer)));
    const auto space = value.rfind(' ');
    Fd fd = connect_until(value.substr(0, space), std::stoi(value.substr(space + 1)), deadline);
    const int32_t me = rank;
    if (!fd || !write_all(fd.get(), &me, sizeof(me))) {
      throw PeerError(name(rank) + ": cannot connect to " + name(peer) + " at " + value +
                      " (liveness monitor); check that the hosts can reach each other");
    }
    peers_.push_back({peer, std::move(fd), Clock::now(), {}, false});
  }
  for (int accepted = 0; accepted < rank; ++accepted) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd pfd{listener.get(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) {
      throw TimeoutError(name(rank) + ": only " + std::to_string(accepted) + " of the " +
                         std::to_string(rank) + " lower ranks connected within " +
                         format_duration(options.connect_timeout()) +
                         " (liveness monitor); start every rank, or raise the connect timeout");
    }
    Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    int32_t peer = -1;
    if (!fd || !read_exact(fd.get(), &peer, sizeof(peer), deadline) || peer < 0 || peer >= rank) {
      --accepted;  // a stray connection; keep waiting for the real peers
      continue;
    }
    peers_.push_back({peer, std::move(fd), Clock::now(), {}, false});
  }
  for (Peer& p : peers_) {
    set_nonblocking(p.fd.get());
    set_nodelay(p.fd.get());
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw CommError(std::string("cannot create the monitor's wake-up pipe: ") + std::strerror(errno));
  }
  wake_read_ = Fd(pipe_fds[0]);
  wake_write_ = Fd(pipe_fds[1]);
  thread_ = std::thread([this] { run(); });
}

PeerMonitor::~PeerMonitor() {
  stop_ = true;
  const char byte = 0;
  if (wake_write_) (void)!::write(wake_write_.get(), &byte, 1);
  if (thread_.joinable()) thread_.join();
}

void PeerMonitor::broadcast(const std::string& bytes) {
  std::lock_guard<std::mutex> lock(send_mu_);
  for (Peer& p : peers_) {
    if (p.closed) continue;
    // Non-blocking: a full socket buffer means the peer is not reading; it will learn from
    // the closed connection instead.
    (void)::send(p.fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void PeerMonitor::send_goodbye() { broadcast("B"); }

void PeerMonitor::send_failure(const std::string& reason) {
  const std::string text = reason.substr(0, kMaxReason);
  const uint32_t n = static_cast<uint32_t>(text.size());
  std::string bytes = "F";
  bytes.append(reinterpret_cast<const char*>(&n), sizeof(n));
  bytes += text;
  broadcast(bytes);
}

void PeerMonitor::parse(Peer& peer) {
  size_t pos = 0;
  while (pos < peer.inbox.size()) {
    const char tag = peer.inbox[pos];
    if (tag == 'P') {
      ++pos;
    } else if (tag == 'B') {
      ++pos;
      faults_->raise({peer.rank, FaultKind::Left, ""});
    } else if (tag == 'F') {
      uint32_t n = 0;
      if (peer.inbox.size() - pos < 1 + sizeof(n)) break;
      std::memcpy(&n, peer.inbox.data() + pos + 1, sizeof(n));
      if (n > kMaxReason) n = kMaxReason;
      if (peer.inbox.size() - pos < 1 + sizeof(n) + n) break;
      faults_->raise({peer.rank, FaultKind::Failed, peer.inbox.substr(pos + 1 + sizeof(n), n)});
      pos += 1 + sizeof(n) + n;
    } else {
      faults_->raise({peer.rank, FaultKind::Died, "its liveness connection sent garbage"});
      peer.closed = true;
      pos = peer.inbox.size();
    }
  }
  peer.inbox.erase(0, pos);
}

void PeerMonitor::handle_readable(Peer& peer) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(peer.fd.get(), buffer, sizeof(buffer), 0);
    if (n > 0) {
      peer.last_seen = Clock::now();
      peer.inbox.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    parse(peer);
    peer.closed = true;  // EOF or reset; a goodbye or failure parsed above explains it
    faults_->raise({peer.rank, FaultKind::Died, n == 0 ? "" : std::strerror(errno)});
    return;
  }
  parse(peer);
}

void PeerMonitor::run() {
  const auto interval = options_.heartbeat_interval();
  const auto silence = options_.effective_heartbeat_timeout();
  auto next_ping = Clock::now();
  std::vector<pollfd> fds;
  while (!stop_) {
    const auto now = Clock::now();
    if (now >= next_ping) {
      broadcast("P");
      next_ping = now + interval;
    }
    fds.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    for (Peer& p : peers_) fds.push_back({p.closed ? -1 : p.fd.get(), POLLIN, 0});
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_ping - Clock::now());
    const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait.count(), 0)) + 1);
    if (rc < 0 && errno != EINTR) break;
    if (stop_) break;
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (fds[i + 1].revents != 0 && !peers_[i].closed) handle_readable(peers_[i]);
    }
    const auto t = Clock::now();
    for (Peer& p : peers_) {
      if (!p.closed && t - p.last_seen > silence) {
        const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(t - p.last_seen);
        faults_->raise({p.rank, FaultKind::Unresponsive, "no heartbeat for " + format_duration(quiet)});
        p.last_seen = t;  // report again only after another full silence
      }
    }
  }
}

}  // namespace pipetrain::comm::detail
