// Peer rounds: NCCL's pairwise exchange as a plan family.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"

namespace hoccl {
namespace varipath {

namespace {

// Peer rounds as a decomposition: round k pairs s with (s + k) mod n (NCCL's pairwise
// exchange).  Fused, its order is round-major, which spreads each source's first transfers
// over distinct receivers.
Decomposition peer_decomposition(const Network& net, const std::vector<int64_t>& demand) {
  Decomposition dec;
  dec.family = kPeerRounds;
  dec.unique = true;
  dec.pairs.reserve(static_cast<size_t>(net.n));
  dec.bytes.reserve(static_cast<size_t>(net.n));
  for (int k = 1; k < net.n; ++k) {
    std::vector<int> pairs;
    std::vector<int64_t> amount;
    pairs.reserve(static_cast<size_t>(net.n));
    amount.reserve(static_cast<size_t>(net.n));
    for (int s = 0; s < net.n; ++s) {
      const int p = s * net.n + (s + k < net.n ? s + k : s + k - net.n);
      if (demand[p] <= 0) continue;
      pairs.push_back(p);
      amount.push_back(demand[p]);
    }
    if (pairs.empty()) continue;
    dec.pairs.push_back(std::move(pairs));
    dec.bytes.push_back(std::move(amount));
  }
  return dec;
}

}  // namespace

bool build_peer_rounds(PlanSearch* s) {
  s->decs.push_back(peer_decomposition(s->net, s->demand));
  return false;
}

}  // namespace varipath
}  // namespace hoccl
