// IDX files (the MNIST family's array format), plain or gzipped, read with zlib.
#include "apps/data/idx.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

#include "pipetrain/error.h"

namespace pipetrain::data {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;
constexpr int kMaxRank = 4;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

class Reader {
 public:
  Reader(std::string path, std::string fix) : path_(std::move(path)), fix_(std::move(fix)) {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0)
      fail(fmt::format("cannot open it: {}", std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) fail("it is not a regular file");
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) fail(fmt::format("cannot open it: {}", std::strerror(errno)));
    gzbuffer(file_.get(), 1 << 17);
  }

  // Reads up to `n` bytes; returns how many were read (fewer only at the end of the stream).
  size_t read(uint8_t* out, size_t n) {
    size_t total = 0;
    while (total < n) {
      const unsigned chunk =
          static_cast<unsigned>(std::min<size_t>(n - total, std::numeric_limits<int>::max() / 2));
      const int got = gzread(file_.get(), out + total, chunk);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_.get(), &code);
        fail(fmt::format("the gzip stream is corrupt ({}) after {} bytes", message,
                         offset_ + total));
      }
      if (got == 0) break;
      total += static_cast<size_t>(got);
    }
    offset_ += total;
    return total;
  }

  bool at_end() {
    uint8_t byte = 0;
    return read(&byte, 1) == 0;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(fmt::format("IDX file {}: {}{}", path_, what, fix_.empty() ? "" : "; " + fix_));
  }

 private:
  std::string path_, fix_;
  GzFile file_;
  size_t offset_ = 0;
};

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (const int64_t d : dims) n *= d;
  return n;
}

IdxArray read_idx(const std::string& path, const std::string& fix) {
  Reader reader(path, fix);
  uint8_t magic[4];
  const size_t got = reader.read(magic, 4);
  if (got < 4) reader.fail(fmt::format("the file is {} bytes long, too short for a header", got));
  if (magic[0] != 0 || magic[1] != 0)
    reader.fail(
        fmt::format("bad magic number 0x{:02x}{:02x}{:02x}{:02x}, expected 0x0000TTRR "
                    "(TT = type, RR = rank); is it an IDX file?",
                    magic[0], magic[1], magic[2], magic[3]));
  if (magic[2] != kUnsignedByte)
    reader.fail(fmt::format("element type 0x{:02x} is not supported, expected 0x08 (unsigned byte)",
                            magic[2]));
  const int rank = magic[3];
  if (rank < 1 || rank > kMaxRank)
    reader.fail(fmt::format("rank {} is not supported, expected 1 to {}", rank, kMaxRank));

  IdxArray array;
  array.path = path;
  uint8_t sizes[4 * kMaxRank];
  if (reader.read(sizes, 4 * rank) < static_cast<size_t>(4 * rank))
    reader.fail(fmt::format("the header ends before its {} dimension sizes", rank));
  int64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = big_endian(sizes + 4 * i);
    array.dims.push_back(d);
    numel *= d;
    if (numel > (int64_t{1} << 34)) reader.fail("the dimensions describe more than 16 GiB");
  }
  array.data.resize(static_cast<size_t>(numel));
  const size_t body = reader.read(array.data.data(), array.data.size());
  if (body < array.data.size())
    reader.fail(fmt::format("truncated: the header announces {} data bytes, the file holds {}",
                            numel, body));
  if (!reader.at_end())
    reader.fail(fmt::format("trailing bytes after the {} data bytes the header announces", numel));
  return array;
}

}  // namespace pipetrain::data
