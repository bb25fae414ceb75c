// Files and renames that survive a power loss: every write checked, every file and directory
// fsync'ed before it is relied upon.
//
// A rename is atomic but not durable: until the directories holding the names are synced, a
// crash can undo it or, worse, keep the new name while the file's data never reached the disk
// (a zero-length or garbage checkpoint where the good one used to be). The checkpoint writers
// therefore sync each file they write, then its directory, then rename, then sync the parent
// again, and only then delete what the rename replaced.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

namespace pipetrain {

// A file written with POSIX calls, each one checked. write() never throws: LibTorch's archive
// writer calls it from C code (miniz) that an exception must not cross. The first failure is
// kept, later writes are skipped, and commit() raises it. Opening fails at once.
//
//   DurableFile f(dir / "layer_00000.pt");   // CheckpointError if it cannot be created
//   archive.save_to(f.writer());
//   f.commit();                               // fsync + close; CheckpointError on any failure
class DurableFile {
 public:
  // Creates or truncates `path` (mode 0644). CheckpointError naming it and errno's text.
  explicit DurableFile(std::filesystem::path path);
  // Closes without syncing when commit() was not reached (an exception is on its way).
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  // Appends n bytes and returns n, even after a failure (see the class comment).
  size_t write(const void* data, size_t n) noexcept;
  void write(const std::string& text) noexcept { write(text.data(), text.size()); }
  // write() as the function LibTorch's OutputArchive::save_to takes; valid while *this lives.
  std::function<size_t(const void*, size_t)> writer();

  // fsync, then close. CheckpointError naming the file, the call that failed and errno's text
  // for the first failed write, the fsync or the close.
  void commit();

  const std::filesystem::path& path() const { return path_; }

 private:
  void fail(const char* call, int err) noexcept;

  std::filesystem::path path_;
  int fd_ = -1;
  std::string error_;  // the first failure, "write: No space left on device"; "" while none
};

// Writes `text` to `path` as one DurableFile (checked, synced, closed).
void write_durable_file(const std::filesystem::path& path, const std::string& text);

// fsync of a directory, so that the names created, renamed or removed in it are on disk.
// CheckpointError naming it when it cannot be opened or synced.
void sync_directory(const std::filesystem::path& dir);

// rename(from, to) that is durable when it returns: the parent directories are synced before
// (so `from`'s own name is on disk) and after (so the new name is). The caller syncs `from`
// itself (a file with DurableFile::commit, a directory with sync_directory).
void durable_rename(const std::filesystem::path& from, const std::filesystem::path& to);

// For tests: called after every successful fsync of a file or a directory, with its path as
// given, from whichever thread synced it (ranks run as threads in tests). Empty: none.
void set_sync_observer(std::function<void(const std::filesystem::path& synced)> observer);

}  // namespace pipetrain
