// A decomposition: one candidate family's channel phases of a demand, in order, with the bytes
// of every pair in each.  The scheduler costs it unfused and with runs of consecutive phases
// fused, and materialize() turns the winner into the plan.
#pragma once

#include <cstdint>
#include <vector>

#include "varipath/network.h"
#include "varipath/phase.h"

namespace hoccl {
namespace varipath {

struct Decomposition {
  std::vector<std::vector<int>> pairs;
  std::vector<std::vector<int64_t>> bytes;
  int64_t quantum = 0;
  int family = 0;                      // its family code (scheduler.h)
  bool unique = false;                 // every pair in at most one phase (peer, split, direct)
  // Each phase lasts exactly its longest transfer alone at its path rate (without copy-engine
  // queues): at most one transfer per link (link-greedy, split), or shared links that provably
  // delay no transfer past it (backfill()).
  bool disjoint = false;
  bool backfilled = false;             // by backfill(): offered unfused only
  bool have1 = false, exact1 = false;  // merged_bound(merge 1), when already computed
  double bound1 = 0.0;
  uint64_t sig1 = 0;
};

// The phases of `chans` (with `bytes`) fused in runs of `merge`; a pair repeated inside a run
// becomes one transfer.
std::vector<Phase> materialize(const Network& net, const std::vector<std::vector<int>>& chans,
                               const std::vector<std::vector<int64_t>>& bytes, int merge);

}  // namespace varipath
}  // namespace hoccl
