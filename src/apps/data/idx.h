// IDX files (the MNIST family's array format), plain or gzipped, read with zlib.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::data {

// An IDX array of unsigned bytes (type code 0x08), the only type the MNIST family uses.
//
//   offset 0: 0x00 0x00 <type 0x08> <rank>   (the "magic number", e.g. 0x00000803)
//   offset 4: rank x uint32 big-endian dimension sizes
//   then:     prod(dims) bytes, row-major
struct IdxArray {
  std::string path;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;

  int64_t numel() const;
};

// Reads a whole IDX file; a ".gz" file (or any gzip stream) is inflated on the fly. Throws
// DataError naming the file for a missing or unreadable file, a bad magic number, an
// unsupported type, a truncated body, trailing bytes or a corrupt gzip stream. `fix` is
// appended to every message (how to get a good copy, e.g. "reinstall with ...").
IdxArray read_idx(const std::string& path, const std::string& fix = "");

}  // namespace pipetrain::data
