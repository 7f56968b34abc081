// Direct: every transfer in one phase, the plan `direct` issues.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"
#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

// All pairs in one phase in source-major order (what `direct` issues).
Decomposition direct_decomposition(const Network& net, const std::vector<int64_t>& demand) {
  Decomposition dec;
  dec.family = kDirect;
  dec.unique = true;
  dec.pairs.emplace_back();
  dec.bytes.emplace_back();
  dec.pairs.back().reserve(demand.size());
  dec.bytes.back().reserve(demand.size());
  for (size_t p = 0; p < demand.size(); ++p)
    if (net.pair_src[p] != net.pair_dst[p] && demand[p] > 0) {
      dec.pairs.back().push_back(static_cast<int>(p));
      dec.bytes.back().push_back(demand[p]);
    }
  return dec;
}

bool build_direct(PlanSearch* s) {
  // Source-major order starts every source on the same few receivers; with copy-engine queues
  // that serialises the whole exchange.  Below kMaxSimulatedRanks the event model sees it and
  // rejects it where needed; past it (bounds only) the candidate is not offered.
  const bool queued_blind = s->model.copy_engines > 0 && s->net.n > kMaxSimulatedRanks;
  if (!queued_blind || s->candidates == kDirect) s->decs.push_back(direct_decomposition(s->net, s->demand));
  return false;
}

}  // namespace varipath
}  // namespace hoccl
