// TensorBoard event files written directly: scalars that `tensorboard --logdir DIR` plots,
// without TensorFlow or a protobuf library.
//
// A file is a sequence of TFRecords, each
//   uint64 length | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)
// (little-endian), whose data is a serialized tensorflow.Event:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2", then one Event per scalar.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace pipetrain::util {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new file events.out.tfevents.<seconds>.<hostname>
  // in it (".<pid>" added when that name is taken), and writes the file_version record.
  // ConfigError naming the directory when it cannot be created or written.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event holding one scalar, stamped with the current wall-clock time (TensorBoard's
  // "relative" and "wall" axes need the epoch, not a steady clock).
  void add_scalar(const std::string& tag, double value, int64_t step);
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);
  // Makes every event written so far readable by a running TensorBoard. Error when a write
  // failed (a full disk).
  void flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(std::string_view data);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace pipetrain::util
