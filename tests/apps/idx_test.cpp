// IDX parsing: plain and gzipped files, and every way a file can be wrong.
#include "apps/data/idx.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "apps/data/fashion_mnist.h"
#include "data_test_util.h"
#include "pipetrain/error.h"

namespace pipetrain::data {
namespace {

using pipetrain::testing::idx_bytes;
using pipetrain::testing::scratch_dir;
using pipetrain::testing::write_gz;
using pipetrain::testing::write_raw;
using ::testing::HasSubstr;

// The DataError message of `fn`, or "" when it does not throw one.
template <typename Fn>
std::string data_error(Fn fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(Idx, ReadsPlainAndGzippedFiles) {
  const auto dir = scratch_dir("idx_read");
  const auto bytes = idx_bytes(0x08, {2, 3}, {1, 2, 3, 4, 5, 6});
  write_raw(dir + "/a.idx", bytes);
  write_gz(dir + "/a.idx.gz", bytes);
  for (const auto* name : {"/a.idx", "/a.idx.gz"}) {
    const IdxArray a = read_idx(dir + name);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.numel(), 6);
    EXPECT_EQ(a.data, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
  }
}

TEST(Idx, MissingFileNamesThePathAndTheFix) {
  const auto message = data_error([] { read_idx("/nonexistent/x-idx1-ubyte.gz", "run the fix"); });
  EXPECT_THAT(message, HasSubstr("/nonexistent/x-idx1-ubyte.gz"));
  EXPECT_THAT(message, HasSubstr("No such file"));
  EXPECT_THAT(message, HasSubstr("run the fix"));
}

TEST(Idx, RejectsMalformedFiles) {
  const auto dir = scratch_dir("idx_bad");
  struct Case {
    const char* name;
    std::vector<uint8_t> bytes;
    const char* expected;
  };
  auto with_trailing = idx_bytes(0x08, {2}, {1, 2});
  with_trailing.push_back(9);
  const std::vector<Case> cases{
      {"short", {0, 0, 8}, "too short for a header"},
      {"magic", {1, 2, 8, 1, 0, 0, 0, 1, 7}, "bad magic number 0x01020801"},
      {"type", idx_bytes(0x0D, {1}, {0, 0, 0, 0}), "element type 0x0d"},
      {"rank", {0, 0, 8, 0}, "rank 0"},
      {"dims", {0, 0, 8, 2, 0, 0, 0, 1}, "ends before its 2 dimension sizes"},
      {"truncated", idx_bytes(0x08, {4, 4}, {1, 2, 3}),
       "announces 16 data bytes, the file holds 3"},
      {"trailing", with_trailing, "trailing bytes"},
  };
  for (const auto& c : cases) {
    for (const bool gz : {false, true}) {
      const std::string path = dir + "/" + c.name + (gz ? ".gz" : "");
      gz ? write_gz(path, c.bytes) : write_raw(path, c.bytes);
      const auto message = data_error([&] { read_idx(path); });
      EXPECT_THAT(message, HasSubstr(c.expected)) << c.name << (gz ? " (gz)" : "");
      EXPECT_THAT(message, HasSubstr(path));
    }
  }
}

TEST(Idx, RejectsACorruptGzipStream) {
  const auto dir = scratch_dir("idx_gzip");
  // A gzip header whose deflate body is garbage.
  write_raw(dir + "/bad.gz", {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0x03, 0xff, 0xff, 0xff, 0xff,
                              0x12, 0x34, 0x56, 0x78});
  EXPECT_THAT(data_error([&] { read_idx(dir + "/bad.gz"); }), HasSubstr("gzip stream is corrupt"));
  // A good stream cut short.
  std::vector<uint8_t> body(5000);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint8_t>(i * 7919 % 251);
  write_gz(dir + "/cut.gz", idx_bytes(0x08, {5000}, body));
  std::ifstream in(dir + "/cut.gz", std::ios::binary);
  std::vector<uint8_t> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gz.resize(gz.size() / 2);
  write_raw(dir + "/cut.gz", gz);
  EXPECT_THAT(data_error([&] { read_idx(dir + "/cut.gz"); }),
              ::testing::AnyOf(HasSubstr("corrupt"), HasSubstr("truncated")));
  EXPECT_THAT(data_error([&] { read_idx(dir); }), HasSubstr("not a regular file"));
}

// A small fake Fashion-MNIST directory: n images of 28 x 28 and `labels`.
std::string fake_fashion_mnist(const std::string& name, uint32_t n, std::vector<uint8_t> labels,
                               uint32_t side = 28) {
  const auto dir = scratch_dir(name);
  std::vector<uint8_t> pixels(n * side * side);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i % 256);
  for (const char* split : {"train", "t10k"}) {
    write_gz(dir + "/" + split + "-images-idx3-ubyte.gz", idx_bytes(0x08, {n, side, side}, pixels));
    write_gz(dir + "/" + split + "-labels-idx1-ubyte.gz",
             idx_bytes(0x08, {static_cast<uint32_t>(labels.size())}, labels));
  }
  return dir;
}

TEST(FashionMnist, LoadsNormalisedImagesAndInt64Labels) {
  const auto dir = fake_fashion_mnist("fm_ok", 3, {0, 9, 4});
  const ImageSet set = load_fashion_mnist(Split::kTest, dir);
  EXPECT_EQ(set.images.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(set.images.dtype(), torch::kFloat32);
  EXPECT_EQ(set.labels.dtype(), torch::kInt64);
  EXPECT_TRUE(torch::equal(set.labels, torch::tensor({0, 9, 4}, torch::kInt64)));
  EXPECT_NEAR(set.images[0][0][0][1].item<float>(),
              (1 / 255.0 - kFashionMnistMean) / kFashionMnistStd, 1e-6);
}

TEST(FashionMnist, RejectsShapesAndLabelsThatDoNotFit) {
  EXPECT_THAT(data_error([] {
                load_fashion_mnist(Split::kTrain, fake_fashion_mnist("fm_n", 3, {0, 1}));
              }),
              HasSubstr("2 labels for the 3 images"));
  EXPECT_THAT(data_error([] {
                load_fashion_mnist(Split::kTrain, fake_fashion_mnist("fm_l", 2, {0, 10}));
              }),
              HasSubstr("label 10 of sample 1"));
  EXPECT_THAT(
      data_error([] { load_fashion_mnist(Split::kTrain, fake_fashion_mnist("fm_s", 1, {0}, 27)); }),
      HasSubstr("[N, 28, 28]"));
}

TEST(FashionMnist, MissingDirectoryPointsAtTheInstallScript) {
  const auto message = data_error([] { check_fashion_mnist("/nonexistent/fashion"); });
  EXPECT_THAT(message, HasSubstr("/nonexistent/fashion/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(message, HasSubstr("bash scripts/install-deps.sh"));
  EXPECT_THAT(data_error([] { load_fashion_mnist(Split::kTrain, "/nonexistent/fashion"); }),
              HasSubstr("bash scripts/install-deps.sh"));
}

TEST(FashionMnist, ThePackagedDataSet) {
  try {
    check_fashion_mnist();
  } catch (const DataError& e) {
    GTEST_SKIP() << e.what();
  }
  const ImageSet test = load_fashion_mnist(Split::kTest);
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  // Fashion-MNIST's test set has 1000 samples of each class.
  EXPECT_TRUE(torch::equal(torch::bincount(test.labels), torch::full({10}, 1000, torch::kInt64)));
  EXPECT_NEAR(test.images.mean().item<double>(), 0.0, 0.05);
  EXPECT_NEAR(test.images.std().item<double>(), 1.0, 0.05);
}

}  // namespace
}  // namespace pipetrain::data
