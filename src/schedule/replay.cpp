// The one interpreter of schedule timing: stages in list order, async sends, blocking receives.
#include "replay.h"

#include <algorithm>

namespace pipetrain::schedule::detail {

ReplayResult replay(const Schedule& s, const ReplayCosts& costs, bool record_times) {
  const int P = s.num_stages();
  ReplayResult r;
  r.stopped_at.assign(P, 0);
  if (record_times) {
    r.start.resize(P);
    r.end.resize(P);
    for (int j = 0; j < P; ++j) {
      r.start[j].resize(s.stages[j].size());
      r.end[j].resize(s.stages[j].size());
    }
  }
  std::vector<double> arrival(message_count(s), -1.0);  // -1: not sent yet
  std::vector<int> waiter(message_count(s), -1);
  std::vector<double> clock(P, 0.0);
  std::vector<int> ready;
  ready.reserve(P);
  for (int j = P - 1; j >= 0; --j) ready.push_back(j);
  while (!ready.empty()) {
    const int j = ready.back();
    ready.pop_back();
    const auto& actions = s.stages[j];
    int& k = r.stopped_at[j];
    while (k < static_cast<int>(actions.size())) {
      const Action& a = actions[k];
      double end = clock[j];
      if (is_recv(a.op)) {
        const size_t m = message_of(s, a);
        if (arrival[m] < 0) {
          waiter[m] = j;
          break;
        }
        end = std::max(clock[j], arrival[m]);
      } else if (is_send(a.op)) {
        const size_t m = message_of(s, a);
        arrival[m] = clock[j] + (a.peer_stage == j ? 0.0 : costs.transfer[j]);
        if (waiter[m] >= 0) {
          ready.push_back(waiter[m]);
          waiter[m] = -1;
        }
      } else {
        end = clock[j] + costs.op[j][static_cast<int>(a.op)];
      }
      if (record_times) {
        r.start[j][k] = clock[j];
        r.end[j][k] = end;
      }
      clock[j] = end;
      ++k;
    }
  }
  for (int j = 0; j < P; ++j)
    if (r.stopped_at[j] < static_cast<int>(s.stages[j].size())) r.finished = false;
  return r;
}

}  // namespace pipetrain::schedule::detail
