// Two "hosts": ranks in two network namespaces joined by a veth pair, each with its own
// address, train across the link; cutting it makes both ranks exit non-zero within the
// communication timeout, naming the rank they lost. Skips itself where namespaces cannot be
// made (not root, no `ip`, no CAP_NET_ADMIN).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/child_process.h"

namespace pipetrain::apps {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Runs a shell command; its exit status and output.
std::pair<int, std::string> shell(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe)) out += buffer;
  return {::pclose(pipe), out};
}

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    const std::string id = std::to_string(::getpid() % 100000);
    a_ = "pt-a-" + id;
    b_ = "pt-b-" + id;
    const std::string va = "pta" + id, vb = "ptb" + id;
    const auto [code, out] = shell("ip netns add " + a_ + " && ip netns add " + b_ + " && ip link add " + va +
                                   " netns " + a_ + " type veth peer name " + vb + " netns " + b_);
    if (code != 0) {
      cleanup();
      GTEST_SKIP() << "cannot create network namespaces here: " << out;
    }
    link_a_ = va;
    for (const auto& [ns, dev, addr] : {std::tuple{a_, va, kAddrA}, std::tuple{b_, vb, kAddrB}}) {
      const auto [c, o] = shell("ip -n " + ns + " addr add " + addr + "/24 dev " + dev + " && ip -n " + ns +
                                " link set " + dev + " up && ip -n " + ns + " link set lo up");
      ASSERT_EQ(c, 0) << o;
    }
    dir_ = fs::temp_directory_path() / ("pipetrain-two-hosts-" + id);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << R"({"pipeline": {"comm_timeout_s": 4}})";
  }
  void TearDown() override {
    cleanup();
    if (!dir_.empty() && !std::getenv("PIPETRAIN_KEEP_TEST_FILES")) fs::remove_all(dir_);
  }
  void cleanup() {
    if (!a_.empty()) shell("ip netns del " + a_);
    if (!b_.empty()) shell("ip netns del " + b_);
  }

  // Rank `rank` of 2 in namespace `ns`: `pipetrain train --worker` with the torchrun variables.
  std::vector<std::string> rank_command(const std::string& ns, int rank) const {
    return {"ip", "netns", "exec", ns, "env", "RANK=" + std::to_string(rank), "WORLD_SIZE=2", "LOCAL_RANK=0",
            "LOCAL_WORLD_SIZE=1", std::string("MASTER_ADDR=") + kAddrA, "MASTER_PORT=29500", "OMP_NUM_THREADS=1",
            PIPETRAIN_CLI_PATH, "train", "--worker", "--example", "mlp", "--steps", "2000", "--log-every", "1",
            "--config", (dir_ / "config.json").string(), "--run-dir", (dir_ / "run").string()};
  }

  static constexpr const char* kAddrA = "10.213.0.1";
  static constexpr const char* kAddrB = "10.213.0.2";
  std::string a_, b_, link_a_;
  fs::path dir_;
};

TEST_F(TwoHosts, TrainAcrossTheLinkThenACutLinkIsACleanTimelyError) {
  pipetrain::testing::ChildProcess rank0(rank_command(a_, 0), (dir_ / "rank0.log").string());
  pipetrain::testing::ChildProcess rank1(rank_command(b_, 1), (dir_ / "rank1.log").string());
  // Training steps complete across the namespaces (rank 0 logs a line per step).
  ASSERT_TRUE(rank0.wait_for("loss", 5, 60s)) << rank0.output() << "\n---\n" << rank1.output();
  const auto cut = std::chrono::steady_clock::now();
  const auto [code, out] = shell("ip -n " + a_ + " link set " + link_a_ + " down");
  ASSERT_EQ(code, 0) << out;
  // Bounded waits are hang guards only.
  const int status0 = rank0.wait(120s);
  const double seconds0 = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  const int status1 = rank1.wait(120s);
  const double seconds1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  std::printf("link cut: rank 0 exited %d after %.1f s, rank 1 exited %d after %.1f s\n", status0, seconds0, status1,
              seconds1);
  EXPECT_GT(status0, 0) << rank0.output();
  EXPECT_GT(status1, 0) << rank1.output();
  // Timely is the cause, not a duration a busy machine stretches: each names its lost peer and
  // the configured 4 s that ended it (not the 30 s default, nor training on): the peer's 4 s of
  // silence, or a receive's 4 s timeout where that fired first.
  auto ended_by_the_4_s = [](const std::string& out, const std::string& peer) {
    return out.find(peer + " stopped answering (no heartbeat for 4.0 s") != std::string::npos ||
           (out.find(peer) != std::string::npos && out.find("timed out after 4 s") != std::string::npos);
  };
  EXPECT_TRUE(ended_by_the_4_s(rank0.output(), "rank 1")) << rank0.output();
  EXPECT_TRUE(ended_by_the_4_s(rank1.output(), "rank 0")) << rank1.output();
}

}  // namespace
}  // namespace pipetrain::apps
