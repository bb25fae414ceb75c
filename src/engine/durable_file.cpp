// Checked, synced writes and durable renames for the checkpoint writers.
#include "durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "pipetrain/error.h"

namespace pipetrain {

namespace fs = std::filesystem;

namespace {

std::function<void(const fs::path&)>& sync_observer() {
  static std::function<void(const fs::path&)> observer;
  return observer;
}

void synced(const fs::path& path) {
  if (sync_observer()) sync_observer()(path);
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// A path's directory; "." for a bare name (fs::path("ckpt").parent_path() is empty).
fs::path parent_of(const fs::path& path) {
  const auto parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

}  // namespace

DurableFile::DurableFile(fs::path path) : path_(std::move(path)) {
  do {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    throw CheckpointError("cannot create checkpoint file " + path_.string() + ": " + errno_text(errno) +
                          "; check that its directory exists and is writable");
  }
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t DurableFile::write(const void* data, size_t n) noexcept {
  const char* p = static_cast<const char*>(data);
  size_t left = error_.empty() ? n : 0;
  while (left > 0) {
    const ssize_t w = ::write(fd_, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      // write() returning 0 for a non-empty buffer would loop forever; treat it as a full disk.
      fail("write", w < 0 ? errno : ENOSPC);
      break;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  return n;
}

std::function<size_t(const void*, size_t)> DurableFile::writer() {
  return [this](const void* data, size_t n) { return write(data, n); };
}

void DurableFile::fail(const char* call, int err) noexcept {
  if (error_.empty()) error_ = std::string(call) + ": " + errno_text(err);
}

void DurableFile::commit() {
  if (fd_ < 0) throw CheckpointError("checkpoint file " + path_.string() + " was already committed");
  if (error_.empty() && ::fsync(fd_) != 0) fail("fsync", errno);
  // close() can report a write-back failure (NFS, quotas) that fsync did not.
  if (::close(fd_) != 0 && errno != EINTR) fail("close", errno);
  fd_ = -1;
  if (!error_.empty()) {
    throw CheckpointError("cannot write checkpoint file " + path_.string() + " (" + error_ +
                          "); free space there or save the checkpoint to another directory");
  }
  synced(path_);
}

void write_durable_file(const fs::path& path, const std::string& text) {
  DurableFile file(path);
  file.write(text);
  file.commit();
}

void sync_directory(const fs::path& dir) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw CheckpointError("cannot open directory " + dir.string() + " to sync it: " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: this file system cannot sync directories (some network and FUSE ones); their
  // renames are as durable as they will ever be, so refusing to checkpoint would only hurt.
  if (rc != 0 && err != EINVAL) {
    throw CheckpointError("cannot sync directory " + dir.string() + " (fsync: " + errno_text(err) +
                          "); the checkpoint would not survive a power loss");
  }
  synced(dir);
}

void durable_rename(const fs::path& from, const fs::path& to) {
  const auto from_dir = parent_of(from);
  const auto to_dir = parent_of(to);
  sync_directory(from_dir);
  if (to_dir != from_dir) sync_directory(to_dir);
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) {
    throw CheckpointError("cannot rename " + from.string() + " to " + to.string() + ": " + ec.message());
  }
  sync_directory(to_dir);
  if (to_dir != from_dir) sync_directory(from_dir);
}

void set_sync_observer(std::function<void(const fs::path& synced)> observer) {
  sync_observer() = std::move(observer);
}

}  // namespace pipetrain
