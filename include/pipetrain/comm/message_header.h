// The header that travels with a point-to-point message: the layout of its tensors (count,
// atomic or tuple, dtype, shape, requires_grad of each) and its wire encoding.
//
// Wire format of a control message (little-endian), sent before the data of every message:
//
//   offset 0  u32 magic 'PTMH'   4 u8 version   5 u8 flags (bit 0: layout follows)
//          6  u16 reserved       8 u64 sequence number of the message in its stream
//         16  u32 stream code   20 u32 layout bytes L (0 when bit 0 is clear)
//         24  layout (L bytes):  u8 atomic, u8 count, then per tensor
//                                u8 dtype code, u8 flags (bit 0: requires_grad, bit 1: none),
//                                u8 ndim, ndim x i64 sizes
//
// None is an undefined tensor in a tuple (an optional skip that stashed nothing, see
// Batch::tuple_with_none): dtype code 0, flags bit 1 alone, ndim 0, and zero data bytes. A
// message without one is encoded exactly as before none existed.
//
// The layout is present on a stream's first message and whenever it differs from the
// previous message's; otherwise the message repeats the previous layout (24 bytes in all).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/batch/batch.h"

namespace pipetrain::comm {

constexpr uint32_t kHeaderMagic = 0x484D5450;  // "PTMH"
constexpr uint8_t kHeaderVersion = 1;
constexpr size_t kControlPrefixBytes = 24;
constexpr size_t kMaxMessageTensors = 64;
constexpr size_t kMaxTensorDims = 16;
// The per-tensor flags of a layout.
constexpr uint8_t kTensorRequiresGrad = 1;
constexpr uint8_t kTensorNone = 2;
// Largest control message: the prefix plus a layout of kMaxMessageTensors tensors of
// kMaxTensorDims dimensions. Receivers post buffers of this size.
constexpr size_t kMaxControlBytes =
    kControlPrefixBytes + 2 + kMaxMessageTensors * (3 + 8 * kMaxTensorDims);
// One tensor may not exceed this many bytes (a sanity bound for decoding; 1 TiB).
constexpr int64_t kMaxTensorBytes = int64_t{1} << 40;

struct TensorLayout {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> sizes;
  bool requires_grad = false;
  bool none = false;  // an undefined tensor: no dtype, sizes or data

  int64_t numel() const;  // 0 for none
  int64_t nbytes() const;
  bool operator==(const TensorLayout& o) const {
    return none == o.none && dtype == o.dtype && sizes == o.sizes && requires_grad == o.requires_grad;
  }
  bool operator!=(const TensorLayout& o) const { return !(*this == o); }
};

struct MessageLayout {
  bool atomic = true;
  std::vector<TensorLayout> tensors;

  // The layout of `batch` (undefined values, from Batch::tuple_with_none, are none); BatchError
  // for an empty batch, more than kMaxMessageTensors tensors, more than kMaxTensorDims
  // dimensions or a dtype that cannot travel.
  static MessageLayout of(const Batch& batch);
  bool operator==(const MessageLayout& o) const {
    return atomic == o.atomic && tensors == o.tensors;
  }
  bool operator!=(const MessageLayout& o) const { return !(*this == o); }
  // "Tensor[32, 1024] Float" or "(Tensor[4, 8] Float, Tensor[4, 8] Bool, None)"
  std::string describe() const;
};

struct ControlMessage {
  uint64_t seq = 0;
  uint32_t stream_code = 0;
  std::optional<MessageLayout> layout;  // absent: same layout as the previous message
};

// Whether a dtype can travel (float32/64, float16, bfloat16, bool, u8, i8, i16, i32, i64).
bool is_supported_dtype(c10::ScalarType dtype);

std::vector<uint8_t> encode_control(const ControlMessage& message);

// Decodes a control message from the first `size` bytes of `data` (a receive buffer may be
// longer than the message). Never reads past `size`; anything malformed (bad magic or
// version, a length past the buffer, unknown dtype, too many tensors or dimensions, negative
// or overflowing sizes, trailing bytes inside the layout) raises CommError saying what.
ControlMessage decode_control(const uint8_t* data, size_t size);

}  // namespace pipetrain::comm
