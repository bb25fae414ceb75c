// What went wrong with a peer: died, reported an error, stopped answering, or left.
#pragma once

#include <string>

#include "pipetrain/comm/options.h"

namespace pipetrain::comm {

enum class FaultKind {
  Died,          // its connection closed without a goodbye: killed, crashed, or exited early
  Failed,        // it reported an error before stopping (detail holds its message)
  Unresponsive,  // no heartbeat for the heartbeat timeout: hung host or broken network
  Left,          // it shut down cleanly; only a fault when something still waits on it
};

struct Fault {
  int rank = -1;
  FaultKind kind = FaultKind::Died;
  std::string detail;

  // "stage 0 (rank 0) died (its connection closed without a goodbye: killed or crashed)"
  std::string describe(const RankNamer& namer) const;
};

}  // namespace pipetrain::comm
