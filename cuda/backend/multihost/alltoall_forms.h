// The two forms of all_to_all across hosts and the cost model that picks one per call.
//
// direct: every cross-host block goes point to point from its sender's input into its
//   receiver's output (one gloo message per non-empty cross-host pair).
// rail:   inside each host, every rank first hands the blocks for remote rank d to its host's
//   relay for d (the local rank whose local index is d's local index, modulo the host's size:
//   d's rail peer wherever the host has one); each relay then sends one aggregated message per
//   destination, and the destination scatters it into its output. Per destination one message
//   per remote host instead of one per remote rank, for extra copies inside the hosts.
//
// Both the plan and the choice are functions of the host layout and the split matrix only; every
// rank holds the same matrix after the split exchange, so every rank runs the same form.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/multihost/host_layout.h"

namespace hoccl {

// Bytes every rank sends to every rank: at(s, d) is what s sends to d.
struct SplitMatrix {
  int world = 0;
  std::vector<int64_t> bytes;     // row-major, world x world
  std::vector<int64_t> expected;  // row-major: expectedAt(d, s) is what d expects from s
  int64_t at(int s, int d) const { return bytes[static_cast<size_t>(s) * world + d]; }
  int64_t expectedAt(int d, int s) const { return expected[static_cast<size_t>(d) * world + s]; }
};

enum class AlltoallForm { Direct, Rail };

// HOCCL_MULTIHOST_ALLTOALL: auto (the cost model), direct or rail.
enum class AlltoallChoice { Auto, Direct, Rail };
AlltoallChoice alltoallChoice(const std::string& setting);

// The rank of host `srcHost` that relays every block of that host destined for rank `dst`.
int relayFor(const HostLayout& layout, int srcHost, int dst);

// The constants of the cost model (docs/multihost.md). Defaults measured on the 2-core test VM.
struct AlltoallCosts {
  double messageSec = 250e-6;      // alpha: one cross-host message at the rank that sends or receives it
  double linkBytesPerSec = 0.5e9;  // beta: one host's link, each way
  double copyBytesPerSec = 1e9;    // gamma: one rank's memory copies inside a host, allocations included
};

// Estimated seconds of one form for this matrix: alpha x the most messages any rank sends plus
// receives, the busiest host link's bytes over beta, the most bytes any rank copies over gamma.
double estimateSeconds(const HostLayout& layout, const SplitMatrix& m, AlltoallForm form,
                       const AlltoallCosts& costs);

// The cheaper form (direct on a tie: it needs no extra copies).
AlltoallForm chooseForm(const HostLayout& layout, const SplitMatrix& m, const AlltoallCosts& costs);

}  // namespace hoccl
