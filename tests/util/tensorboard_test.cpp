// TensorBoard event files: read back record by record (both checksums, every field), the exact
// bytes of one scalar event, file naming, and errors that name the directory.
#include "pipetrain/util/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>

#include "pipetrain/error.h"
#include "support/tfevents_reader.h"

namespace pipetrain::util {
namespace {

namespace fs = std::filesystem;
using pipetrain::testing::find_tfevents;
using pipetrain::testing::read_tfevents;

class TensorBoard : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipetrain-tb-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST_F(TensorBoard, ScalarsReadBackWithTheirStepsAndTags) {
  const double before = now_s();
  fs::path path;
  {
    TensorBoardWriter writer(dir_ / "nested" / "job");  // parents are created
    path = writer.path();
    writer.add_scalar("Train/Samples/train_loss", 2.5, 32);
    writer.add_scalar("Train/Samples/lr", 1e-3, 32);
    writer.add_scalar("Train/Samples/train_loss", -0.125, 64);
    writer.add_scalar("big/step", 7.0, int64_t{1} << 40);
    writer.flush();
  }
  EXPECT_EQ(path.parent_path(), dir_ / "nested" / "job");
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string name = path.filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(name.substr(name.size() - std::string(host).size()), host) << name;
  const auto seconds = std::stoll(name.substr(std::string("events.out.tfevents.").size()));
  EXPECT_NEAR(static_cast<double>(seconds), before, 5.0);

  const auto events = read_tfevents(path);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].scalars.empty());
  struct Expected {
    const char* tag;
    float value;
    int64_t step;
  };
  const Expected expected[] = {{"Train/Samples/train_loss", 2.5f, 32},
                               {"Train/Samples/lr", 1e-3f, 32},
                               {"Train/Samples/train_loss", -0.125f, 64},
                               {"big/step", 7.0f, int64_t{1} << 40}};
  for (size_t i = 0; i < 4; ++i) {
    const auto& e = events[i + 1];
    EXPECT_TRUE(e.file_version.empty());
    ASSERT_EQ(e.scalars.size(), 1u);
    EXPECT_EQ(e.scalars[0].first, expected[i].tag);
    EXPECT_EQ(e.scalars[0].second, expected[i].value);
    EXPECT_EQ(e.step, expected[i].step);
    EXPECT_GE(e.wall_time, before - 1);
    EXPECT_LE(e.wall_time, now_s() + 1);
  }
}

// The bytes of Event{wall_time 0, step 2, summary {value {tag "a", simple_value 1}}}, as
// protobuf encodes them, inside a record whose framing the reader checks.
TEST_F(TensorBoard, OneScalarEventHasProtobufsBytes) {
  fs::path path;
  size_t first_record = 0;
  {
    TensorBoardWriter writer(dir_);
    path = writer.path();
    first_record = fs::file_size(path);
    writer.add_scalar("a", 1.0, 2, 0.0);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string event("\x09\0\0\0\0\0\0\0\0"  // field 1, fixed64: wall_time 0.0
                          "\x10\x02"              // field 2, varint: step 2
                          "\x2a\x0a"              // field 5, 10 bytes: summary
                          "\x0a\x08"              //   field 1, 8 bytes: value
                          "\x0a\x01" "a"          //     field 1: tag "a"
                          "\x15\0\0\x80\x3f",     //     field 2, fixed32: 1.0f
                          23);
  ASSERT_EQ(file.size(), first_record + 8 + 4 + event.size() + 4);
  EXPECT_EQ(file.substr(first_record, 8), std::string("\x17\0\0\0\0\0\0\0", 8));  // length 23, little-endian
  EXPECT_EQ(file.substr(first_record + 12, event.size()), event);
  EXPECT_EQ(read_tfevents(path).size(), 2u);  // and both checksums hold
}

TEST_F(TensorBoard, WritersInOneDirectoryGetTheirOwnFiles) {
  TensorBoardWriter a(dir_), b(dir_);
  EXPECT_NE(a.path(), b.path());
  a.add_scalar("x", 1, 1);
  b.add_scalar("x", 2, 1);
  a.flush();
  b.flush();
  const auto files = find_tfevents(dir_);
  ASSERT_EQ(files.size(), 2u);
  for (const auto& f : files) EXPECT_EQ(read_tfevents(f).size(), 2u);
}

TEST_F(TensorBoard, UnwritableDirectoryIsAConfigErrorNamingIt) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "a-file") << "x";
  try {
    TensorBoardWriter writer(dir_ / "a-file" / "tb");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find((dir_ / "a-file" / "tb").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("writable directory"), std::string::npos) << e.what();
  }
}

TEST_F(TensorBoard, ATruncatedOrCorruptedFileIsDetectedByTheReader) {
  fs::path path;
  {
    TensorBoardWriter writer(dir_);
    path = writer.path();
    writer.add_scalar("loss", 0.5, 1);
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto rewrite = [&](const std::string& b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };
  std::string flipped = bytes;
  flipped[flipped.size() - 6] ^= 0x01;  // inside the last event's data
  rewrite(flipped);
  EXPECT_THROW(read_tfevents(path), std::runtime_error);
  rewrite(bytes.substr(0, bytes.size() - 2));
  EXPECT_THROW(read_tfevents(path), std::runtime_error);
  rewrite(bytes);
  EXPECT_EQ(read_tfevents(path).size(), 2u);
}

}  // namespace
}  // namespace pipetrain::util
