// Checkpoints survive a power loss, not just a crash: every file and directory is synced before
// the rename that publishes it, <dir>.old outlives the sync that makes the new one durable, and
// a write that fails (a full disk) is a CheckpointError that leaves the previous one in place.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/checkpoint_support.h"
#include "engine/durable_file.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/error.h"

namespace pipetrain::testing {
namespace {

namespace fs = std::filesystem;

class CheckpointDurability : public CheckpointDirTest {
 protected:
  // Hooks are process-wide: never leave one behind for the next test, even on a failure.
  void TearDown() override {
    set_checkpoint_fault_hook({});
    set_sync_observer({});
    CheckpointDirTest::TearDown();
  }
};

EngineConfig adam_config(int stages) {
  auto c = ckpt_config(stages);
  c.optimizer.type = "Adam";  // so that optimizer-state files are written too
  c.optimizer.lr = 0.01;
  return c;
}

PipelineModule durability_mlp() { return mlp(5, 8, 5, 3); }

// Where `event` first occurs at or after `from`; events.size() when it does not.
size_t find_event(const std::vector<std::string>& events, const std::string& event, size_t from = 0) {
  return static_cast<size_t>(std::find(events.begin() + static_cast<std::ptrdiff_t>(from), events.end(), event) -
                             events.begin());
}

TEST_F(CheckpointDurability, FilesAndDirectoriesAreSyncedBeforeTheRenameAndOldOutlivesTheSync) {
  const auto ckpt = (dir_ / "ckpt").string();
  const fs::path partial(ckpt + ".partial"), old(ckpt + ".old");
  run_pipeline(2, adam_config(2), durability_mlp, [&](PipelineEngine& engine) {
    train_steps(engine, 1, 0);
    save_checkpoint(engine, ckpt);  // the previous checkpoint, which the next save replaces
  });

  // Both ranks' threads write files: one ordered log of syncs and phases.
  std::mutex mutex;
  std::vector<std::string> events;
  std::map<std::string, bool> old_kept;       // phase -> <dir>.old still holds a checkpoint
  std::map<std::string, int64_t> step_found;  // phase -> the step a load would find
  set_sync_observer([&](const fs::path& path) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back("sync " + path.string());
  });
  set_checkpoint_fault_hook([&](const std::string& phase) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back("phase " + phase);
    if (phase == "renamed" || phase == "synced") {
      old_kept[phase] = fs::exists(old / "manifest.json");
      step_found[phase] = checkpoint_step(ckpt);
    }
  });
  run_pipeline(2, adam_config(2), durability_mlp, [&](PipelineEngine& engine) {
    load_checkpoint(engine, ckpt);
    train_steps(engine, 1, 1);
    save_checkpoint(engine, ckpt);
  });
  set_checkpoint_fault_hook({});
  set_sync_observer({});

  std::string log;
  for (const auto& e : events) log += e + "\n";
  const size_t swap = find_event(events, "phase swap");
  const size_t renamed = find_event(events, "phase renamed");
  const size_t synced = find_event(events, "phase synced");
  ASSERT_LT(swap, renamed) << log;
  ASSERT_LT(renamed, synced) << log;
  ASSERT_LT(synced, events.size()) << log;

  // Every file of the new checkpoint (layers, optimizer state, RNG states of both ranks, the
  // manifest) was synced under its .partial name, then the .partial directory, before the
  // previous checkpoint was moved aside.
  const size_t partial_synced = find_event(events, "sync " + partial.string());
  EXPECT_LT(partial_synced, swap) << log;
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    const auto name = entry.path().filename().string();
    EXPECT_LT(find_event(events, "sync " + (partial / name).string()), partial_synced) << name << "\n" << log;
    ++files;
  }
  EXPECT_EQ(files, 5u + 3 + 2 + 1);  // 5 layers, 3 with parameters (Adam state), 2 RNG states, manifest
  // The parent directory: synced before the renames (partial's own name) and between the last
  // rename and the "synced" phase (the new name).
  const std::string parent = "sync " + dir_.string();
  EXPECT_LT(find_event(events, parent, partial_synced), swap) << log;
  EXPECT_LT(find_event(events, parent, renamed), synced) << log;

  // .old is deleted only after that last sync: a power loss before it still finds one.
  EXPECT_TRUE(old_kept["renamed"]) << "<dir>.old was deleted before the new checkpoint was durable";
  EXPECT_TRUE(old_kept["synced"]);
  EXPECT_EQ(step_found["renamed"], 2);
  EXPECT_FALSE(fs::exists(old));
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_EQ(checkpoint_step(ckpt), 2);
}

TEST_F(CheckpointDurability, AFullDiskIsACheckpointErrorNamingTheFileAndKeepsThePreviousCheckpoint) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full to stand for a full disk";
  const auto ckpt = (dir_ / "ckpt").string();
  const fs::path partial(ckpt + ".partial");
  run_pipeline(1, adam_config(1), durability_mlp, [&](PipelineEngine& engine) {
    train_steps(engine, 2, 0);
    save_checkpoint(engine, ckpt);
  });
  ASSERT_EQ(checkpoint_step(ckpt), 2);

  // One file at a time lands on a full device: /dev/full takes the open and fails every write
  // with ENOSPC, as a full file system does. The symlink is put in place once .partial exists.
  for (const std::string file : {"layer_00000.pt", "layer_00000-optim.pt", "rng_rank_00000.pt", "manifest.json"}) {
    SCOPED_TRACE(file);
    run_pipeline(1, adam_config(1), durability_mlp, [&](PipelineEngine& engine) {
      load_checkpoint(engine, ckpt);
      train_steps(engine, 1, 2);
      set_checkpoint_fault_hook([&](const std::string& phase) {
        if (phase == "start") fs::create_symlink("/dev/full", partial / file);
        // A lost error must fail the test, not hang it: the checksum would read /dev/full's
        // endless zeros.
        if (phase == "files" && file != "manifest.json") {
          throw std::runtime_error(file + " was written onto a full disk without an error");
        }
      });
      try {
        save_checkpoint(engine, ckpt);
        ADD_FAILURE() << "a save onto a full disk succeeded";
      } catch (const CheckpointError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find((partial / file).string()), std::string::npos) << what;
        EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
      }
      set_checkpoint_fault_hook({});
    });
    EXPECT_EQ(checkpoint_step(ckpt), 2) << "the previous checkpoint must survive a failed save";
  }
}

TEST_F(CheckpointDurability, AFullDiskUnderTheLatestPointerKeepsThePreviousTag) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full to stand for a full disk";
  const auto dir = dir_.string();
  run_pipeline(1, ckpt_config(1), durability_mlp, [&](PipelineEngine& engine) {
    train_steps(engine, 1, 0);
    EXPECT_EQ(save_tagged_checkpoint(engine, dir), "global_step1");
    train_steps(engine, 1, 1);
    set_checkpoint_fault_hook([&](const std::string& phase) {
      if (phase == "latest") fs::create_symlink("/dev/full", dir_ / "latest.tmp");
    });
    try {
      save_tagged_checkpoint(engine, dir);
      ADD_FAILURE() << "the latest pointer was written onto a full disk";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find((dir_ / "latest.tmp").string()), std::string::npos) << what;
      EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
    }
    set_checkpoint_fault_hook({});
  });
  EXPECT_EQ(latest_tag(dir), "global_step1");
}

}  // namespace
}  // namespace pipetrain::testing
