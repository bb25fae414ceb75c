// Point-to-point cost of the Gloo channel between two processes on loopback: round trips of
// the "mlp" workload's 128 KiB activations, against raw c10d Gloo send/recv of the same bytes
// (no header, no speculation) measured in the same run, plus a comm-only pipeline step.
//
// Run: build/bench/comm_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// The binary starts its peer (rank 1) itself.
#include <benchmark/benchmark.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "pipetrain/comm/communicator.h"
#include "pipetrain/comm/net.h"

extern char** environ;

namespace {

using namespace pipetrain;
using namespace pipetrain::comm;

enum Mode : int64_t { kStop = 0, kEcho = 1, kRawEcho = 2, kStep = 3 };
constexpr int kStepMessages = 8;  // micro-batches per step in the "mlp" workload

std::unique_ptr<Communicator> g_comm;
c10::intrusive_ptr<c10d::ProcessGroupGloo> g_raw;

c10::intrusive_ptr<c10d::ProcessGroupGloo> raw_group(int rank, int port) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = rank == 0;
  so.numWorkers = 2;
  so.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, opts);
}

void command(Mode mode, int64_t n, int64_t rows, int64_t cols) {
  g_comm->channel().isend(1, Stream::aux(), Batch(torch::tensor({static_cast<int64_t>(mode), n, rows, cols})), "command");
}

// Rank 1: obeys commands until told to stop.
void peer_loop() {
  Channel& ch = g_comm->channel();
  for (;;) {
    const torch::Tensor cmd = ch.irecv(0, Stream::aux(), "command").wait().tensor();
    const auto mode = static_cast<Mode>(cmd[0].item<int64_t>());
    const int64_t n = cmd[1].item<int64_t>();
    if (mode == kStop) return;
    if (mode == kEcho) {
      for (int64_t i = 0; i < n; ++i) {
        Batch x = ch.irecv(0, Stream::activation(), "activation").wait();
        ch.isend(0, Stream::gradient(), x, "gradient");
      }
    } else if (mode == kRawEcho) {
      // The best case for raw Gloo: the next receive is always posted before it is needed.
      std::vector<std::vector<at::Tensor>> bufs(2, {torch::empty({cmd[2].item<int64_t>(), cmd[3].item<int64_t>()})});
      bufs[1] = {torch::empty_like(bufs[0][0])};
      auto posted = g_raw->recv(bufs[0], 0, 1);
      for (int64_t i = 0; i < n; ++i) {
        posted->wait();
        auto& got = bufs[static_cast<size_t>(i % 2)];
        if (i + 1 < n) posted = g_raw->recv(bufs[static_cast<size_t>((i + 1) % 2)], 0, 1);
        g_raw->send(got, 0, 2)->wait();
      }
    } else if (mode == kStep) {
      for (int64_t i = 0; i < n; ++i) {
        std::vector<RecvHandle> acts;
        for (int m = 0; m < kStepMessages; ++m) acts.push_back(ch.irecv(0, Stream::activation(), "activation"));
        for (int m = 0; m < kStepMessages; ++m) ch.isend(0, Stream::gradient(), acts[static_cast<size_t>(m)].wait(), "gradient");
      }
    }
    ch.wait_sends();
  }
}

void BM_ChannelRoundTrip(benchmark::State& state) {
  const int64_t rows = state.range(0) / 4096;
  Channel& ch = g_comm->channel();
  command(kEcho, state.max_iterations, rows, 1024);
  const Batch x(torch::randn({rows, 1024}));
  for (auto _ : state) {
    RecvHandle r = ch.irecv(1, Stream::gradient(), "gradient");
    ch.isend(1, Stream::activation(), x, "activation");
    benchmark::DoNotOptimize(r.wait());
  }
  ch.wait_sends();
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(BM_ChannelRoundTrip)->Arg(128 << 10)->Arg(4 << 10)->UseRealTime();

// The layout alternates every message: the header travels each time and the receiver's
// speculative receives are replaced (the variable-sequence-length case).
void BM_ChannelRoundTripShapeChanges(benchmark::State& state) {
  Channel& ch = g_comm->channel();
  command(kEcho, state.max_iterations, 32, 1024);
  const Batch a(torch::randn({32, 1024}));
  const Batch b(torch::randn({31, 1024}));
  int64_t i = 0;
  for (auto _ : state) {
    RecvHandle r = ch.irecv(1, Stream::gradient(), "gradient");
    ch.isend(1, Stream::activation(), (i++ % 2) ? a : b, "activation");
    benchmark::DoNotOptimize(r.wait());
  }
  ch.wait_sends();
  state.SetBytesProcessed(state.iterations() * (128 << 10) * 2);
}
BENCHMARK(BM_ChannelRoundTripShapeChanges)->UseRealTime();

// Baseline: c10d ProcessGroupGloo send/recv of the same bytes, shapes known in advance and
// the peer's next receive always posted ahead (no header, no threads of ours).
void BM_RawGlooRoundTrip(benchmark::State& state) {
  const int64_t rows = state.range(0) / 4096;
  command(kRawEcho, state.max_iterations, rows, 1024);
  std::vector<at::Tensor> x{torch::randn({rows, 1024})};
  std::vector<at::Tensor> y{torch::empty({rows, 1024})};
  for (auto _ : state) {
    auto r = g_raw->recv(y, 1, 2);
    g_raw->send(x, 1, 1)->wait();
    r->wait();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(BM_RawGlooRoundTrip)->Arg(128 << 10)->Arg(4 << 10)->UseRealTime();

// A pipeline step without compute: 8 activations forward, 8 gradients back, receives
// posted early on both sides (what 2 stages of "mlp" exchange per step).
void BM_ChannelStep(benchmark::State& state) {
  Channel& ch = g_comm->channel();
  command(kStep, state.max_iterations, 32, 1024);
  std::vector<Batch> acts;
  for (int m = 0; m < kStepMessages; ++m) acts.emplace_back(torch::randn({32, 1024}));
  for (auto _ : state) {
    std::vector<RecvHandle> grads;
    for (int m = 0; m < kStepMessages; ++m) grads.push_back(ch.irecv(1, Stream::gradient(), "gradient"));
    for (int m = 0; m < kStepMessages; ++m) ch.isend(1, Stream::activation(), acts[static_cast<size_t>(m)], "activation");
    for (auto& g : grads) benchmark::DoNotOptimize(g.wait());
  }
  ch.wait_sends();
  state.SetBytesProcessed(state.iterations() * kStepMessages * (128 << 10) * 2);
}
BENCHMARK(BM_ChannelStep)->UseRealTime();

// What the engine sees: post the receive of the reply, send, compute for 5 ms (here: sleep),
// then wait. wait_us is the time the wait still blocks; 0 means the transfer (both ways, with
// its header) was hidden behind the compute.
void BM_ChannelOverlap(benchmark::State& state) {
  Channel& ch = g_comm->channel();
  command(kEcho, state.max_iterations, 32, 1024);
  const Batch x(torch::randn({32, 1024}));
  double waited = 0;
  for (auto _ : state) {
    RecvHandle r = ch.irecv(1, Stream::gradient(), "gradient");
    ch.isend(1, Stream::activation(), x, "activation");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(r.wait());
    waited += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  ch.wait_sends();
  state.counters["wait_us"] = waited / static_cast<double>(state.iterations());
}
BENCHMARK(BM_ChannelOverlap)->UseRealTime();

// Reference: copying the bytes of one message within a process.
void BM_Memcpy128K(benchmark::State& state) {
  auto a = torch::randn({32, 1024});
  auto b = torch::empty({32, 1024});
  for (auto _ : state) {
    std::memcpy(b.data_ptr(), a.data_ptr(), 128 << 10);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (128 << 10));
}
BENCHMARK(BM_Memcpy128K);

pid_t start_peer(const char* self, int port, int raw_port) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back("PIPETRAIN_BENCH_PEER=1");
  env.push_back("RANK=1");
  env.push_back("WORLD_SIZE=2");
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back("BENCH_RAW_PORT=" + std::to_string(raw_port));
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>(self), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) {
    std::perror("posix_spawn");
    std::exit(1);
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  CommOptions options;
  options.timeout(std::chrono::seconds(60));
  if (std::getenv("PIPETRAIN_BENCH_PEER")) {
    g_comm = connect(rank_info_from_env(), options);
    g_raw = raw_group(1, std::atoi(std::getenv("BENCH_RAW_PORT")));
    peer_loop();
    g_comm->shutdown();
    return 0;
  }
  const int port = find_free_port();
  const int raw_port = find_free_port();
  const pid_t peer = start_peer(argv[0], port, raw_port);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  g_comm = connect(rank_info_from_env(), options);
  g_raw = raw_group(0, raw_port);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  command(kStop, 0, 0, 0);
  g_comm->shutdown();
  int status = 0;
  waitpid(peer, &status, 0);
  g_raw.reset();
  g_comm.reset();
  return 0;
}
