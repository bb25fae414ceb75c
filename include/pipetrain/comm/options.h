// Settings of the communication layer: timeouts, heartbeat, bucket size, how ranks are named.
#pragma once

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace pipetrain::comm {

// Every blocking wait (recv, send completion, collective) fails after this long.
constexpr std::chrono::milliseconds kDefaultTimeout{30'000};
// Rendezvous: how long ranks wait for each other to start (store, process groups).
constexpr std::chrono::milliseconds kDefaultConnectTimeout{120'000};
// How often a rank tells its peers it is alive.
constexpr std::chrono::milliseconds kDefaultHeartbeatInterval{1'000};
// All-reduce flattens tensors into buckets of about this many bytes (as DDP).
constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;

// Which c10d backend runs the collectives. NCCL exists only where LibTorch was built with
// CUDA (USE_C10D_NCCL); the point-to-point channel always runs over Gloo and stages CUDA
// tensors through host memory.
enum class Backend { Gloo, Nccl };
// Whether this LibTorch has c10d's NCCL backend (built with CUDA and USE_C10D_NCCL).
bool nccl_available();
// The backend for a rank whose stage runs on `device`, with `local_world_size` ranks on its
// host and `cuda_devices` GPUs visible: NCCL when the device is a GPU, this LibTorch has NCCL
// and every local rank has a GPU of its own (NCCL refuses two ranks on one GPU); else Gloo.
Backend collective_backend(bool device_is_cuda, int local_world_size, int64_t cuda_devices,
                           bool have_nccl = nccl_available());

// Names a rank in messages: "rank 3" by default, "stage 1 (rank 3)" with a topology.
using RankNamer = std::function<std::string(int rank)>;
std::string default_rank_name(int rank);

struct CommOptions {
  // Every wait; a wait that runs past it raises TimeoutError naming both ends.
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  // Waiting for the other ranks to start and connect.
  TORCH_ARG(std::chrono::milliseconds, connect_timeout) = kDefaultConnectTimeout;
  // Liveness pings between ranks; a peer silent for heartbeat_timeout (0: the same as
  // `timeout`) counts as lost even when no operation waits on it.
  TORCH_ARG(std::chrono::milliseconds, heartbeat_interval) = kDefaultHeartbeatInterval;
  TORCH_ARG(std::chrono::milliseconds, heartbeat_timeout) = std::chrono::milliseconds(0);
  // Bucket size of all-reduce and broadcast over lists of tensors.
  TORCH_ARG(int64_t, bucket_bytes) = kDefaultBucketBytes;
  // The address of this host that the other ranks reach it by; "" picks it automatically
  // (loopback when MASTER_ADDR is loopback, else the interface that routes to MASTER_ADDR).
  TORCH_ARG(std::string, bind_address) = "";
  TORCH_ARG(RankNamer, rank_namer) = default_rank_name;
  TORCH_ARG(Backend, backend) = Backend::Gloo;
  // Where received tensors are placed (the stage's device).
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);

 public:
  // ConfigError for non-positive timeouts or bucket size, or NCCL without CUDA support.
  void validate() const;
  std::chrono::milliseconds effective_heartbeat_timeout() const {
    return heartbeat_timeout_.count() > 0 ? heartbeat_timeout_ : timeout_;
  }
};

// "30 s", "1.5 s", "250 ms": durations in messages.
std::string format_duration(std::chrono::milliseconds d);

}  // namespace pipetrain::comm
