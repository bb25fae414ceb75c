// The p2p header: layouts of batches, encoding round trips, and a decoder that never trusts
// its input (bounded random and mutated inputs).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <random>

#include "pipetrain/comm/message_header.h"
#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace {

MessageLayout tuple_layout() {
  Batch batch = Batch::tuple({torch::randn({4, 7, 16}).requires_grad_(), torch::ones({4, 7}, torch::kBool),
                              torch::zeros({4, 7}, torch::kLong)});
  return MessageLayout::of(batch);
}

TEST(MessageHeader, LayoutOfBatch) {
  {  // LayoutOfBatch
    const MessageLayout layout = tuple_layout();
    EXPECT_FALSE(layout.atomic);
    ASSERT_EQ(layout.tensors.size(), 3u);
    EXPECT_EQ(layout.tensors[0].sizes, (std::vector<int64_t>{4, 7, 16}));
    EXPECT_TRUE(layout.tensors[0].requires_grad);
    EXPECT_EQ(layout.tensors[1].dtype, c10::ScalarType::Bool);
    EXPECT_EQ(layout.tensors[2].nbytes(), 4 * 7 * 8);
    EXPECT_EQ(layout.describe(), "(Tensor[4, 7, 16] Float, Tensor[4, 7] Bool, Tensor[4, 7] Long)");
    EXPECT_TRUE(MessageLayout::of(Batch(torch::zeros({2}))).atomic);
  }
  {  // RejectsWhatCannotTravel
    EXPECT_THROW(MessageLayout::of(Batch()), BatchError);
    EXPECT_THROW(MessageLayout::of(Batch(torch::zeros({2}, torch::kComplexFloat))), BatchError);
    std::vector<int64_t> many_dims(17, 1);
    EXPECT_THROW(MessageLayout::of(Batch(torch::zeros(many_dims))), BatchError);
    std::vector<torch::Tensor> many(65, torch::zeros({1}));
    EXPECT_THROW(MessageLayout::of(Batch(many)), BatchError);
  }
}

TEST(MessageHeader, RoundTrip) {
  {  // RoundTrip
    ControlMessage m{17, 1025, tuple_layout()};
    const auto bytes = encode_control(m);
    EXPECT_EQ(bytes.size(), kControlPrefixBytes + 2 + 3 * 3 + 8 * (3 + 2 + 2));
    const ControlMessage back = decode_control(bytes.data(), bytes.size());
    EXPECT_EQ(back.seq, 17u);
    EXPECT_EQ(back.stream_code, 1025u);
    ASSERT_TRUE(back.layout.has_value());
    EXPECT_EQ(*back.layout, *m.layout);
  }
  {  // UnchangedLayoutIsOnlyThePrefix
    const auto bytes = encode_control({3, 0, std::nullopt});
    EXPECT_EQ(bytes.size(), kControlPrefixBytes);
    // A receive buffer is longer than the message: trailing garbage is never read.
    std::vector<uint8_t> buffer(kMaxControlBytes, 0xAB);
    std::copy(bytes.begin(), bytes.end(), buffer.begin());
    const ControlMessage back = decode_control(buffer.data(), buffer.size());
    EXPECT_EQ(back.seq, 3u);
    EXPECT_FALSE(back.layout.has_value());
  }
  {  // LargestLayoutFitsTheControlBuffer
    std::vector<torch::Tensor> tensors(kMaxMessageTensors, torch::zeros(std::vector<int64_t>(kMaxTensorDims, 1)));
    const auto bytes = encode_control({0, 0, MessageLayout::of(Batch(tensors))});
    EXPECT_EQ(bytes.size(), kMaxControlBytes);
  }
}

std::string decode_error(const std::vector<uint8_t>& bytes) {
  try {
    decode_control(bytes.data(), bytes.size());
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

TEST(MessageHeader, MalformedHeadersNameTheProblem) {
  auto good = encode_control({1, 0, tuple_layout()});
  auto bad = good;
  bad[0] = 'X';
  EXPECT_NE(decode_error(bad).find("magic number"), std::string::npos);
  bad = good;
  bad[4] = 9;
  EXPECT_NE(decode_error(bad).find("version 9"), std::string::npos);
  bad = good;
  bad[kControlPrefixBytes + 2] = 99;  // dtype code of tensor 0
  EXPECT_NE(decode_error(bad).find("unknown dtype code 99"), std::string::npos);
  bad = good;
  bad.resize(30);
  EXPECT_NE(decode_error(bad).find("runs past"), std::string::npos);
  bad = good;
  bad[kControlPrefixBytes + 5 + 7] = 0x80;  // top byte of tensor 0's first size: negative
  EXPECT_NE(decode_error(bad).find("negative size"), std::string::npos);
  bad = good;
  bad[kControlPrefixBytes] = 1;  // atomic with 3 tensors
  EXPECT_NE(decode_error(bad).find("atomic batch with 3 tensors"), std::string::npos);
  EXPECT_NE(decode_error({}).find("ends inside the magic number"), std::string::npos);
}

// An optional skip that stashed nothing travels as none: flags bit 1, no dtype, no sizes, no data.
TEST(MessageHeader, NoneInATuple) {
  const Batch batch = Batch::tuple_with_none({torch::Tensor(), torch::ones({2, 3}).requires_grad_(), torch::Tensor()});
  const MessageLayout layout = MessageLayout::of(batch);
  ASSERT_EQ(layout.tensors.size(), 3u);
  EXPECT_TRUE(layout.tensors[0].none);
  EXPECT_FALSE(layout.tensors[1].none);
  EXPECT_EQ(layout.tensors[0].nbytes(), 0);
  EXPECT_EQ(layout.describe(), "(None, Tensor[2, 3] Float, None)");
  EXPECT_NE(layout, MessageLayout::of(Batch::tuple({torch::ones({1}), torch::ones({2, 3}), torch::ones({1})})));

  const auto bytes = encode_control({5, 7, layout});
  EXPECT_EQ(bytes.size(), kControlPrefixBytes + 2 + 3 * 3 + 8 * 2);
  EXPECT_EQ(bytes[kControlPrefixBytes + 2], 0);        // tensor 0: dtype code 0
  EXPECT_EQ(bytes[kControlPrefixBytes + 3], kTensorNone);  // flags
  EXPECT_EQ(bytes[kControlPrefixBytes + 4], 0);        // no dimensions
  const ControlMessage back = decode_control(bytes.data(), bytes.size());
  ASSERT_TRUE(back.layout.has_value());
  EXPECT_EQ(*back.layout, layout);

  // None with a dtype, sizes or requires_grad, or as an atomic batch, is malformed.
  auto bad = bytes;
  bad[kControlPrefixBytes + 2] = 1;
  EXPECT_NE(decode_error(bad).find("tensor 0 is none but has dtype code 1"), std::string::npos);
  bad = bytes;
  bad[kControlPrefixBytes + 3] = kTensorNone | kTensorRequiresGrad;
  EXPECT_NE(decode_error(bad).find("is none but"), std::string::npos);
  bad = bytes;
  bad[kControlPrefixBytes + 3] = 4;
  EXPECT_NE(decode_error(bad).find("tensor flags 4"), std::string::npos);
  const auto atomic = encode_control({0, 0, MessageLayout{true, {layout.tensors[0]}}});
  EXPECT_NE(decode_error(atomic).find("in an atomic batch"), std::string::npos);
}

// Every input either decodes or raises CommError; nothing else, and never a crash.
void decode_any(const std::vector<uint8_t>& bytes) {
  try {
    const ControlMessage m = decode_control(bytes.data(), bytes.size());
    if (m.layout) {
      EXPECT_LE(m.layout->tensors.size(), kMaxMessageTensors);
      for (const auto& t : m.layout->tensors) EXPECT_LE(t.nbytes(), kMaxTensorBytes);
    }
  } catch (const CommError&) {
  }
}

TEST(MessageHeader, FuzzRandomAndMutatedBytes) {
  {  // FuzzRandomBytes
    std::mt19937 rng(1234);
    for (int i = 0; i < 20000; ++i) {
      std::vector<uint8_t> bytes(rng() % 64);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      // Half of the inputs start with a valid prefix so the layout decoder is reached.
      if (i % 2 == 0 && bytes.size() >= 6) {
        const uint32_t magic = kHeaderMagic;
        std::memcpy(bytes.data(), &magic, 4);
        bytes[4] = kHeaderVersion;
        bytes[5] = 1;
      }
      decode_any(bytes);
    }
  }
  {  // FuzzMutatedHeaders
    std::mt19937 rng(99);
    const auto good = encode_control({5, 2, tuple_layout()});
    for (int i = 0; i < 20000; ++i) {
      auto bytes = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
      if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
      decode_any(bytes);
    }
  }
}

RC_GTEST_PROP(MessageHeader, EncodeDecodeIsIdentity, ()) {
  MessageLayout layout;
  layout.atomic = *rc::gen::arbitrary<bool>();
  const size_t count = layout.atomic ? 1 : *rc::gen::inRange<size_t>(1, 9);
  const std::vector<c10::ScalarType> dtypes{c10::ScalarType::Float, c10::ScalarType::Bool,
                                            c10::ScalarType::Long, c10::ScalarType::Half,
                                            c10::ScalarType::BFloat16, c10::ScalarType::Byte};
  for (size_t i = 0; i < count; ++i) {
    TensorLayout t;
    t.dtype = *rc::gen::elementOf(dtypes);
    t.requires_grad = *rc::gen::arbitrary<bool>();
    t.sizes = *rc::gen::container<std::vector<int64_t>>(*rc::gen::inRange<size_t>(0, 5),
                                                        rc::gen::inRange<int64_t>(0, 300));
    layout.tensors.push_back(t);
  }
  const bool with_layout = *rc::gen::arbitrary<bool>();
  ControlMessage m{*rc::gen::arbitrary<uint64_t>(), *rc::gen::inRange<uint32_t>(0, 4096),
                   with_layout ? std::optional<MessageLayout>(layout) : std::nullopt};
  const auto bytes = encode_control(m);
  RC_ASSERT(bytes.size() <= kMaxControlBytes);
  const ControlMessage back = decode_control(bytes.data(), bytes.size());
  RC_ASSERT(back.seq == m.seq);
  RC_ASSERT(back.stream_code == m.stream_code);
  RC_ASSERT(back.layout.has_value() == with_layout);
  if (with_layout) RC_ASSERT(*back.layout == layout);
}

}  // namespace
}  // namespace pipetrain::comm
