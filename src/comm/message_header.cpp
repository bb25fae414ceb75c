// The p2p message header: layout of a batch and its wire encoding.
#include "pipetrain/comm/message_header.h"

#include <cstring>
#include <limits>

#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace {

// Wire codes are ours, not c10::ScalarType's numbering, so peers built against other
// LibTorch versions agree.
struct DtypeCode {
  c10::ScalarType dtype;
  uint8_t code;
};
constexpr DtypeCode kDtypeCodes[] = {
    {c10::ScalarType::Float, 1}, {c10::ScalarType::Double, 2}, {c10::ScalarType::Half, 3},
    {c10::ScalarType::BFloat16, 4}, {c10::ScalarType::Bool, 5}, {c10::ScalarType::Byte, 6},
    {c10::ScalarType::Char, 7}, {c10::ScalarType::Short, 8}, {c10::ScalarType::Int, 9},
    {c10::ScalarType::Long, 10},
};

std::optional<uint8_t> code_of(c10::ScalarType dtype) {
  for (const auto& d : kDtypeCodes) {
    if (d.dtype == dtype) return d.code;
  }
  return std::nullopt;
}

std::optional<c10::ScalarType> dtype_of(uint8_t code) {
  for (const auto& d : kDtypeCodes) {
    if (d.code == code) return d.dtype;
  }
  return std::nullopt;
}

class Writer {
 public:
  template <typename T>
  void put(T value) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // the hosts we support are little-endian
    out_.insert(out_.end(), bytes, bytes + sizeof(T));
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T get(const char* what) {
    if (size_ - pos_ < sizeof(T)) {
      throw CommError("malformed message header: it ends inside " + std::string(what) +
                      " at byte " + std::to_string(pos_) + " of " + std::to_string(size_));
    }
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

[[noreturn]] void malformed(const std::string& why) {
  throw CommError("malformed message header: " + why +
                  "; the peer runs another pipetrain version or the stream is corrupt");
}

}  // namespace

bool is_supported_dtype(c10::ScalarType dtype) { return code_of(dtype).has_value(); }

int64_t TensorLayout::numel() const {
  if (none) return 0;
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t TensorLayout::nbytes() const {
  return numel() * static_cast<int64_t>(c10::elementSize(dtype));
}

MessageLayout MessageLayout::of(const Batch& batch) {
  if (batch.empty()) {
    throw BatchError("cannot send an empty batch; a stage must pass at least one tensor");
  }
  if (batch.size() > kMaxMessageTensors) {
    throw BatchError("cannot send a tuple of " + std::to_string(batch.size()) +
                     " tensors; at most " + std::to_string(kMaxMessageTensors) +
                     " travel between stages: concatenate some of them");
  }
  MessageLayout layout;
  layout.atomic = batch.atomic();
  for (size_t i = 0; i < batch.size(); ++i) {
    const torch::Tensor& t = batch[i];
    if (!t.defined()) {  // none: an optional skip that stashed nothing (Batch::tuple_with_none)
      TensorLayout absent;
      absent.none = true;
      layout.tensors.push_back(absent);
      continue;
    }
    if (!is_supported_dtype(t.scalar_type())) {
      throw BatchError("tensor " + std::to_string(i) + " of " + batch.describe() + " has dtype " +
                       c10::toString(t.scalar_type()) +
                       ", which cannot be sent between stages; convert it to a float, integer "
                       "or bool dtype");
    }
    if (static_cast<size_t>(t.dim()) > kMaxTensorDims) {
      throw BatchError("tensor " + std::to_string(i) + " of " + batch.describe() + " has " +
                       std::to_string(t.dim()) + " dimensions; at most " +
                       std::to_string(kMaxTensorDims) + " can be sent: reshape it");
    }
    layout.tensors.push_back({t.scalar_type(), t.sizes().vec(), t.requires_grad()});
  }
  return layout;
}

std::string MessageLayout::describe() const {
  std::string out = atomic ? "" : "(";
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i) out += ", ";
    if (tensors[i].none) {
      out += "None";
      continue;
    }
    out += "Tensor[";
    for (size_t d = 0; d < tensors[i].sizes.size(); ++d) {
      if (d) out += ", ";
      out += std::to_string(tensors[i].sizes[d]);
    }
    out += "] " + std::string(c10::toString(tensors[i].dtype));
  }
  return atomic ? out : out + ")";
}

std::vector<uint8_t> encode_control(const ControlMessage& message) {
  Writer layout_writer;
  if (message.layout) {
    const MessageLayout& layout = *message.layout;
    layout_writer.put<uint8_t>(layout.atomic ? 1 : 0);
    layout_writer.put<uint8_t>(static_cast<uint8_t>(layout.tensors.size()));
    for (const TensorLayout& t : layout.tensors) {
      if (t.none) {  // flags bit 1, and neither dtype nor sizes
        layout_writer.put<uint8_t>(0);
        layout_writer.put<uint8_t>(kTensorNone);
        layout_writer.put<uint8_t>(0);
        continue;
      }
      const auto code = code_of(t.dtype);
      if (!code) throw BatchError(std::string("dtype ") + c10::toString(t.dtype) + " cannot be sent");
      layout_writer.put<uint8_t>(*code);
      layout_writer.put<uint8_t>(t.requires_grad ? kTensorRequiresGrad : 0);
      layout_writer.put<uint8_t>(static_cast<uint8_t>(t.sizes.size()));
      for (int64_t s : t.sizes) layout_writer.put<int64_t>(s);
    }
  }
  Writer w;
  w.put<uint32_t>(kHeaderMagic);
  w.put<uint8_t>(kHeaderVersion);
  w.put<uint8_t>(message.layout ? 1 : 0);
  w.put<uint16_t>(0);
  w.put<uint64_t>(message.seq);
  w.put<uint32_t>(message.stream_code);
  w.put<uint32_t>(static_cast<uint32_t>(layout_writer.bytes().size()));
  auto& out = w.bytes();
  out.insert(out.end(), layout_writer.bytes().begin(), layout_writer.bytes().end());
  return out;
}

ControlMessage decode_control(const uint8_t* data, size_t size) {
  Reader r(data, size);
  const auto magic = r.get<uint32_t>("the magic number");
  if (magic != kHeaderMagic) malformed("magic number " + std::to_string(magic) + " is not 'PTMH'");
  const auto version = r.get<uint8_t>("the version");
  if (version != kHeaderVersion) {
    malformed("version " + std::to_string(version) + ", expected " + std::to_string(kHeaderVersion));
  }
  const auto flags = r.get<uint8_t>("the flags");
  if ((flags & ~1u) != 0) malformed("unknown flags " + std::to_string(flags));
  r.get<uint16_t>("the reserved field");
  ControlMessage message;
  message.seq = r.get<uint64_t>("the sequence number");
  message.stream_code = r.get<uint32_t>("the stream code");
  const auto layout_bytes = r.get<uint32_t>("the layout length");
  const bool has_layout = (flags & 1u) != 0;
  if (!has_layout) {
    if (layout_bytes != 0) malformed("a layout length of " + std::to_string(layout_bytes) + " without a layout");
    return message;
  }
  if (layout_bytes > size - r.pos() || layout_bytes > kMaxControlBytes) {
    malformed("layout length " + std::to_string(layout_bytes) + " runs past the " +
              std::to_string(size) + "-byte message");
  }
  const size_t end = r.pos() + layout_bytes;
  MessageLayout layout;
  const auto atomic = r.get<uint8_t>("the atomic flag");
  if (atomic > 1) malformed("atomic flag " + std::to_string(atomic));
  layout.atomic = atomic == 1;
  const auto count = r.get<uint8_t>("the tensor count");
  if (count == 0 || count > kMaxMessageTensors) {
    malformed("tensor count " + std::to_string(count) + " (1.." + std::to_string(kMaxMessageTensors) + ")");
  }
  if (layout.atomic && count != 1) malformed("an atomic batch with " + std::to_string(count) + " tensors");
  for (size_t i = 0; i < count; ++i) {
    TensorLayout t;
    const auto code = r.get<uint8_t>("a dtype");
    const auto tflags = r.get<uint8_t>("tensor flags");
    if ((tflags & ~(kTensorRequiresGrad | kTensorNone)) != 0) malformed("tensor flags " + std::to_string(tflags));
    if ((tflags & kTensorNone) != 0) {
      const auto ndim = r.get<uint8_t>("a dimension count");
      if (code != 0 || ndim != 0 || (tflags & kTensorRequiresGrad) != 0 || layout.atomic) {
        malformed("tensor " + std::to_string(i) + " is none but has dtype code " + std::to_string(code) + ", " +
                  std::to_string(ndim) + " dimensions, flags " + std::to_string(tflags) +
                  (layout.atomic ? " in an atomic batch" : ""));
      }
      t.none = true;
      layout.tensors.push_back(std::move(t));
      continue;
    }
    const auto dtype = dtype_of(code);
    if (!dtype) malformed("unknown dtype code " + std::to_string(code) + " for tensor " + std::to_string(i));
    t.dtype = *dtype;
    t.requires_grad = (tflags & kTensorRequiresGrad) != 0;
    const auto ndim = r.get<uint8_t>("a dimension count");
    if (ndim > kMaxTensorDims) malformed(std::to_string(ndim) + " dimensions for tensor " + std::to_string(i));
    int64_t numel = 1;
    const int64_t limit = kMaxTensorBytes / static_cast<int64_t>(c10::elementSize(t.dtype));
    for (size_t d = 0; d < ndim; ++d) {
      const auto s = r.get<int64_t>("a size");
      if (s < 0) malformed("negative size " + std::to_string(s) + " for tensor " + std::to_string(i));
      if (s > 0 && numel > limit / s) malformed("tensor " + std::to_string(i) + " exceeds 1 TiB");
      numel *= s;
      t.sizes.push_back(s);
    }
    layout.tensors.push_back(std::move(t));
  }
  if (r.pos() != end) {
    malformed("the layout declares " + std::to_string(layout_bytes) + " bytes but holds " +
              std::to_string(r.pos() - (end - layout_bytes)));
  }
  message.layout = std::move(layout);
  return message;
}

}  // namespace pipetrain::comm
