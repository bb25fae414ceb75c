// Offsets between the ranks' clocks, so that events timed on several hosts share one time line.
//
// Each rank times its events on its own steady (monotonic) clock: never stepped by NTP, but
// with an arbitrary origin per host (and per boot). Ranks of one host read the same
// CLOCK_MONOTONIC; across hosts the origins differ by anything. The estimate: every member
// leaves a barrier within about one message latency of the others and reads its clock; the
// offset of member r is the median over rounds of (its reading - member 0's reading). Its
// error is the barrier's exit skew (tens of microseconds over loopback, about a network round
// trip across hosts), well below the millisecond actions of a pipeline step.
#pragma once

#include <functional>
#include <vector>

#include "pipetrain/comm/group.h"

namespace pipetrain::comm {

// Seconds on the steady clock (arbitrary origin; shared by the processes of one host).
double steady_seconds();

// offsets[i] = clock of member i (index in group.ranks()) minus clock of member 0, in seconds;
// subtract it from member i's timestamps to put them on member 0's clock. Every member calls
// it with its own global rank (`rounds` barriers and one all-reduce each).
std::vector<double> estimate_clock_offsets(Group& group, int my_rank,
                                           const std::function<double()>& clock = steady_seconds, int rounds = 7);

// Whether every member runs on this member's host (same host name): their steady clocks are
// then one clock and need no estimate. One all-reduce.
bool all_on_one_host(Group& group);

}  // namespace pipetrain::comm
