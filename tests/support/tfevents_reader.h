// Reads TensorBoard event files back for tests: TFRecord framing with both checksums checked,
// and the Event / Summary / Value protobuf fields of scalars, decoded independently of
// util/tensorboard.cpp (its own bitwise CRC-32C, a generic protobuf field walker).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain::testing {

struct TfEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;  // Summary.Value tag, simple_value
};

namespace tfevents_detail {

inline uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

inline uint64_t little_endian(const std::string& bytes, size_t at, size_t size) {
  uint64_t v = 0;
  for (size_t i = 0; i < size; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes.at(at + i))) << (8 * i);
  return v;
}

// Walks the fields of one protobuf message: calls on_field(number, wire_type, value, bytes),
// value for varint / fixed fields, bytes for length-delimited ones.
template <typename OnField>
void walk(const std::string& message, OnField on_field) {
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= message.size() || shift > 63) throw std::runtime_error("protobuf: truncated varint");
      const auto b = static_cast<unsigned char>(message[at++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (at < message.size()) {
    const uint64_t key = varint();
    const auto field = static_cast<uint32_t>(key >> 3);
    const auto wire = static_cast<uint32_t>(key & 7);
    uint64_t value = 0;
    std::string bytes;
    switch (wire) {
      case 0: value = varint(); break;
      case 1: value = little_endian(message, at, 8); at += 8; break;
      case 5: value = little_endian(message, at, 4); at += 4; break;
      case 2: {
        const uint64_t n = varint();
        if (at + n > message.size()) throw std::runtime_error("protobuf: truncated field");
        bytes = message.substr(at, n);
        at += n;
        break;
      }
      default: throw std::runtime_error("protobuf: wire type " + std::to_string(wire));
    }
    if (at > message.size()) throw std::runtime_error("protobuf: truncated fixed field");
    on_field(field, wire, value, bytes);
  }
}

inline TfEvent decode_event(const std::string& data) {
  TfEvent e;
  walk(data, [&](uint32_t field, uint32_t wire, uint64_t value, const std::string& bytes) {
    if (field == 1 && wire == 1) std::memcpy(&e.wall_time, &value, sizeof e.wall_time);
    if (field == 2 && wire == 0) e.step = static_cast<int64_t>(value);
    if (field == 3 && wire == 2) e.file_version = bytes;
    if (field == 5 && wire == 2) {
      walk(bytes, [&](uint32_t f, uint32_t w, uint64_t, const std::string& value_bytes) {
        if (f != 1 || w != 2) return;
        std::pair<std::string, float> scalar{"", 0.0f};
        walk(value_bytes, [&](uint32_t vf, uint32_t vw, uint64_t v, const std::string& b) {
          if (vf == 1 && vw == 2) scalar.first = b;
          if (vf == 2 && vw == 5) {
            const auto bits = static_cast<uint32_t>(v);
            std::memcpy(&scalar.second, &bits, sizeof bits);
          }
        });
        e.scalars.push_back(scalar);
      });
    }
  });
  return e;
}

}  // namespace tfevents_detail

// Every event of the file; std::runtime_error naming the offset for a truncated record or a
// checksum that does not match.
inline std::vector<TfEvent> read_tfevents(const std::filesystem::path& path) {
  using namespace tfevents_detail;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TfEvent> events;
  size_t at = 0;
  while (at < file.size()) {
    const auto where = path.string() + " at byte " + std::to_string(at);
    if (at + 12 > file.size()) throw std::runtime_error(where + ": truncated record header");
    const uint64_t length = little_endian(file, at, 8);
    if (masked(crc32c_bitwise(file.substr(at, 8))) != little_endian(file, at + 8, 4)) {
      throw std::runtime_error(where + ": length checksum mismatch");
    }
    if (at + 12 + length + 4 > file.size()) throw std::runtime_error(where + ": truncated record");
    const std::string data = file.substr(at + 12, length);
    if (masked(crc32c_bitwise(data)) != little_endian(file, at + 12 + length, 4)) {
      throw std::runtime_error(where + ": data checksum mismatch");
    }
    events.push_back(decode_event(data));
    at += 12 + length + 4;
  }
  return events;
}

// The event files under `dir`, at any depth, sorted by path.
inline std::vector<std::filesystem::path> find_tfevents(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> found;
  if (!std::filesystem::exists(dir)) return found;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      found.push_back(entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace pipetrain::testing
