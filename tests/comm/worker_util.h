// Helpers for rank workers of the comm tests: connecting with test timeouts, reading knobs.
#pragma once

#include <cstdlib>
#include <iostream>
#include <string>

#include "pipetrain/comm/communicator.h"

namespace pipetrain::comm::test {

inline int env_or(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Names ranks by their stage in a pipe of world_size stages, as the engine will.
inline CommOptions test_options(int world_size) {
  CommOptions o;
  o.timeout(std::chrono::milliseconds(env_or("TEST_TIMEOUT_MS", 20'000)));
  o.connect_timeout(std::chrono::milliseconds(30'000));
  o.heartbeat_interval(std::chrono::milliseconds(env_or("TEST_HEARTBEAT_MS", 500)));
  o.heartbeat_timeout(std::chrono::milliseconds(env_or("TEST_HEARTBEAT_TIMEOUT_MS", 0)));
  Topology topo(world_size, 1);
  o.rank_namer([topo](int r) { return topo.describe_rank(r); });
  return o;
}

inline std::unique_ptr<Communicator> connect_for_test() {
  const RankInfo info = rank_info_from_env();
  return connect(info, test_options(info.world_size));
}

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace pipetrain::comm::test
