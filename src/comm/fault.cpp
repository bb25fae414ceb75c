// What went wrong with a peer.
#include "pipetrain/comm/fault.h"

namespace pipetrain::comm {

std::string Fault::describe(const RankNamer& namer) const {
  const std::string who = namer ? namer(rank) : default_rank_name(rank);
  switch (kind) {
    case FaultKind::Died:
      return who + " died (its connection closed without a goodbye: killed, crashed or exited" +
             (detail.empty() ? std::string(")") : "; " + detail + ")");
    case FaultKind::Failed:
      return who + " failed: " + detail;
    case FaultKind::Unresponsive:
      return who + " stopped answering (" + detail + "; hung process or broken network)";
    case FaultKind::Left:
      return who + " has already shut down cleanly (its work was done; the ranks' schedules "
                   "do not match)";
  }
  return who + " is lost";
}

}  // namespace pipetrain::comm
