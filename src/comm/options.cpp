// Settings of the communication layer.
#include "pipetrain/comm/options.h"

#include <cstdio>

#include "pipetrain/error.h"

namespace pipetrain::comm {

std::string default_rank_name(int rank) { return "rank " + std::to_string(rank); }

void CommOptions::validate() const {
  auto positive = [](std::chrono::milliseconds v, const char* name) {
    if (v.count() <= 0) {
      throw ConfigError(std::string("communication option ") + name + " = " +
                        std::to_string(v.count()) + " ms must be positive");
    }
  };
  positive(timeout_, "timeout");
  positive(connect_timeout_, "connect_timeout");
  positive(heartbeat_interval_, "heartbeat_interval");
  if (heartbeat_timeout_.count() < 0) {
    throw ConfigError("communication option heartbeat_timeout = " +
                      std::to_string(heartbeat_timeout_.count()) +
                      " ms must be >= 0 (0: same as timeout)");
  }
  if (effective_heartbeat_timeout() <= heartbeat_interval_) {
    throw ConfigError("heartbeat_timeout " + format_duration(effective_heartbeat_timeout()) +
                      " must exceed heartbeat_interval " + format_duration(heartbeat_interval_) +
                      "; raise the timeout or shorten the interval");
  }
  if (bucket_bytes_ <= 0) {
    throw ConfigError("communication option bucket_bytes = " + std::to_string(bucket_bytes_) +
                      " must be positive (default 25 MiB)");
  }
  if (!rank_namer_) throw ConfigError("communication option rank_namer is empty");
#ifndef USE_C10D_NCCL
  if (backend_ == Backend::Nccl) {
    throw ConfigError("the NCCL backend was requested but this LibTorch was built without CUDA/NCCL "
                      "(USE_C10D_NCCL); use Backend::Gloo");
  }
#endif
}

bool nccl_available() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

Backend collective_backend(bool device_is_cuda, int local_world_size, int64_t cuda_devices, bool have_nccl) {
  const bool own_gpu = local_world_size <= cuda_devices;
  return device_is_cuda && have_nccl && own_gpu ? Backend::Nccl : Backend::Gloo;
}

std::string format_duration(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f s", static_cast<double>(ms) / 1000.0);
  return buffer;
}

}  // namespace pipetrain::comm
