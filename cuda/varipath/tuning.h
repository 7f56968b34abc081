// VarioPath tuning constants read by more than one unit of the scheduler (each unit keeps its
// own).  They are counts and ratios, never clocks, so every rank plans alike.
#pragma once

namespace hoccl {
namespace varipath {

// Up to this many ranks candidates are costed with the event model; past it they are ranked by
// their bounds, and the costlier decompositions are built only within work budgets.
constexpr int kMaxSimulatedRanks = 32;
// The catalog pass (and, with copy-engine queues, the one-host search rules that go with it)
// apply up to this many ranks.
constexpr int kCatalogMaxRanks = 16;
// An exact plan within this fraction of the cost model's lower bound ends the search.
constexpr double kGoodEnough = 0.015;
// Weight floor so that pairs off the bottleneck still get scheduled by volume.
constexpr double kMinWeight = 0.05;
// Link-greedy and sliced split rounds: a pair whose remainder is within this factor of what fits
// in the phase's span sends it whole (a cross-socket pair at 20 GB/s next to 25 GB/s pairs
// stretches the phase by up to 20 % instead of leaving a sliver that costs a whole phase later).
constexpr double kWholeSlack = 1.2;
// Under contention, fusing phases saves start latency but derates shared links; when the
// unfused plan's start latencies are under this share of its cost the saving cannot pay for
// the derating in practice (see Bounds::worth_fusing()).
constexpr double kFuseLatencyShare = 0.03;

}  // namespace varipath
}  // namespace hoccl
