// DurableFile and friends: checked writes whose failures name the file and errno's text, and
// syncs that a test can observe.
#include "engine/durable_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "pipetrain/error.h"

namespace pipetrain::testing {
namespace {

namespace fs = std::filesystem;

class DurableFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pipetrain-durable-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    set_sync_observer([this](const fs::path& p) {
      std::lock_guard<std::mutex> lock(mutex_);
      synced_.push_back(p.string());
    });
  }
  void TearDown() override {
    set_sync_observer({});
    fs::remove_all(dir_);
  }
  static std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // The message of the CheckpointError `f` throws; "" (and a failure) when it throws none.
  template <typename F>
  static std::string checkpoint_error(F&& f) {
    try {
      f();
    } catch (const CheckpointError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no CheckpointError";
    return "";
  }
  fs::path dir_;
  std::mutex mutex_;
  std::vector<std::string> synced_;
};

TEST_F(DurableFileTest, WritesThroughTheArchiveWriterAndSyncsOnCommit) {
  const auto path = dir_ / "a.bin";
  DurableFile file(path);
  auto writer = file.writer();
  EXPECT_EQ(writer("abc", 3), 3u);
  file.write(std::string("def"));
  EXPECT_TRUE(synced_.empty()) << "nothing is synced before commit()";
  file.commit();
  EXPECT_EQ(read(path), "abcdef");
  EXPECT_EQ(synced_, std::vector<std::string>{path.string()});
}

TEST_F(DurableFileTest, AFullDeviceFailsCommitNamingTheFileTheCallAndErrno) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full to stand for a full disk";
  DurableFile file("/dev/full");
  const std::string block(1 << 16, 'x');
  // The archive writer must see every byte "taken" (it calls from C code that cannot unwind);
  // the failure waits for commit().
  EXPECT_EQ(file.write(block.data(), block.size()), block.size());
  EXPECT_EQ(file.write(block.data(), block.size()), block.size());
  const auto what = checkpoint_error([&] { file.commit(); });
  EXPECT_NE(what.find("/dev/full"), std::string::npos) << what;
  EXPECT_NE(what.find("write: No space left on device"), std::string::npos) << what;
  EXPECT_NE(what.find("free space"), std::string::npos) << what << ": the message says what to do";
  EXPECT_TRUE(synced_.empty());

  const auto again = checkpoint_error([] { write_durable_file("/dev/full", "latest\n"); });
  EXPECT_NE(again.find("No space left on device"), std::string::npos) << again;
}

TEST_F(DurableFileTest, AMissingDirectoryIsNamedWhenOpeningOrSyncing) {
  const auto path = dir_ / "missing" / "layer_00000.pt";
  const auto what = checkpoint_error([&] { DurableFile file(path); });
  EXPECT_NE(what.find(path.string()), std::string::npos) << what;
  EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;

  const auto dir_what = checkpoint_error([&] { sync_directory(dir_ / "missing"); });
  EXPECT_NE(dir_what.find((dir_ / "missing").string()), std::string::npos) << dir_what;
}

TEST_F(DurableFileTest, RenameSyncsBothDirectoriesBeforeAndAfter) {
  fs::create_directories(dir_ / "from");
  fs::create_directories(dir_ / "to");
  write_durable_file(dir_ / "from" / "latest.tmp", "global_step4\n");
  synced_.clear();
  durable_rename(dir_ / "from" / "latest.tmp", dir_ / "to" / "latest");
  EXPECT_EQ(read(dir_ / "to" / "latest"), "global_step4\n");
  EXPECT_FALSE(fs::exists(dir_ / "from" / "latest.tmp"));
  const auto from = (dir_ / "from").string(), to = (dir_ / "to").string();
  EXPECT_EQ(synced_, (std::vector<std::string>{from, to, to, from}));

  const auto what = checkpoint_error([&] { durable_rename(dir_ / "from" / "gone", dir_ / "to" / "x"); });
  EXPECT_NE(what.find((dir_ / "from" / "gone").string()), std::string::npos) << what;
}

}  // namespace
}  // namespace pipetrain::testing
