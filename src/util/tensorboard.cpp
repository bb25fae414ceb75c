// TensorBoard event files: TFRecord framing and the few protobuf fields of a scalar Event,
// encoded by hand (see the picture in pipetrain/util/tensorboard.h).
#include "pipetrain/util/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "pipetrain/error.h"
#include "pipetrain/util/crc32c.h"

namespace pipetrain::util {
namespace fs = std::filesystem;
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }

template <typename Unsigned>
void put_little_endian(std::string& out, Unsigned v) {
  for (size_t i = 0; i < sizeof v; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_little_endian(out, bits);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  put_key(e, 2, kVarint);
  put_varint(e, static_cast<uint64_t>(step));  // two's complement, as protobuf encodes int64
  return e;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// The file is created exclusively ("x"), so two writers in one directory never share one.
std::FILE* create_events_file(const fs::path& dir, fs::path& path) {
  const auto seconds = static_cast<int64_t>(now_s());
  const std::string base = "events.out.tfevents." + std::to_string(seconds) + "." + hostname();
  const std::string pid = std::to_string(::getpid());
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = base;
    if (attempt > 0) name += "." + pid;
    if (attempt > 1) name += "." + std::to_string(attempt);
    path = dir / name;
    if (std::FILE* f = std::fopen(path.c_str(), "wbx")) return f;
    if (errno != EEXIST) break;
  }
  throw ConfigError("cannot create a TensorBoard event file " + path.string() + ": " + std::strerror(errno) +
                    "; give a writable directory");
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw ConfigError("cannot create the TensorBoard directory " + dir.string() + ": " + ec.message() +
                      "; give a writable directory");
  }
  file_ = create_events_file(dir, path_);
  std::string first = event(now_s(), 0);
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);  // a failure here was reported by the last flush, or cannot be
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalar(tag, value, step, now_s());
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event(wall_time, step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(std::string_view data) {
  std::string header;
  put_little_endian(header, static_cast<uint64_t>(data.size()));
  const uint32_t length_crc = mask_crc32c(crc32c(header));
  put_little_endian(header, length_crc);
  std::string footer;
  put_little_endian(footer, mask_crc32c(crc32c(data)));
  // Errors stick to the stream; flush() reports them.
  std::fwrite(header.data(), 1, header.size(), file_);
  std::fwrite(data.data(), 1, data.size(), file_);
  std::fwrite(footer.data(), 1, footer.size(), file_);
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0 || std::ferror(file_)) {
    throw Error("writing TensorBoard events to " + path_.string() + " failed: " + std::strerror(errno) +
                "; check the free space of that file system");
  }
}

}  // namespace pipetrain::util
