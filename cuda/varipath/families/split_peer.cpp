// Split peer rounds: peer rounds packed into link-disjoint phases, for many ranks.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"
#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

namespace {

// Pairs whose busiest link carries at least this share of the busiest link's load are placed
// first.
constexpr double kHotShare = 0.5;
// Split rounds are sliced under contention when the hot link's pairs need under this share of
// the plan's time in start latencies (bandwidth-bound sizes, where the unfused plan wins);
// below, whole pairs (fewer transfers, cheaper bounds).
constexpr double kSliceLatencyShare = 0.05;

// Peer rounds packed into link-disjoint phases: pairs in round order (s -> s+k for k = 1, 2, ...),
// the pairs crossing a link loaded to at least kHotShare of the busiest link first, each placed
// whole in the first phase where all its links are still free (first fit; a bit set of phases
// per link).  Every phase carries at most one transfer per link, so its cost is exact, like a
// link-greedy phase, but building it costs one pass over the pairs, where link-greedy scans
// them once per phase.  Cooler pairs then fill the links the hot ones leave idle.
// Sliced (under contention, bandwidth-bound sizes: see kSliceLatencyShare): the first transfer
// placed in a phase sets its span (its time at its pair rate); a later pair sends what fits in that span (a remainder within kWholeSlack
// goes whole) and its remainder goes on to the next phase where its links are free, as
// link-greedy's slices do: unfused, no phase waits on a long cold pair (64 ranks, 256 MB: MoE
// traffic 0.97x and hot experts 0.98x the best baseline, where whole pairs took 1.23x and 1.72x).
Decomposition split_peer_decomposition(const Network& net, const std::vector<int64_t>& demand,
                                       const std::vector<double>& weight, bool sliced) {
  Decomposition dec;
  dec.family = kSplitPeer;
  dec.unique = true;
  dec.disjoint = true;
  std::vector<int> order;  // placement order: hot pairs, then the others, each in round order
  std::vector<int> cold;
  order.reserve(demand.size());
  cold.reserve(demand.size());
  const double hot_weight = kMinWeight + kHotShare;
  for (int k = 1; k < net.n; ++k)
    for (int s = 0, d = k; s < net.n; ++s, d = d + 1 == net.n ? 0 : d + 1) {
      const int p = s * net.n + d;
      if (demand[p] > 0) (weight[p] >= hot_weight ? order : cold).push_back(p);
    }
  order.insert(order.end(), cold.begin(), cold.end());
  const size_t links = net.link_bw.size();
  // Bit sets of 4 words per link to start with (256 phases): a pair's first fit ORs its links'
  // four words at once.  (The first free phase at or after `from` does not depend on how many
  // words are kept: phases past the last word are all free.)
  constexpr size_t kWords = 4;
  size_t words = kWords;
  std::vector<uint64_t> used(links * words, 0);  // link-major: used[l * words + w]
  std::vector<double> span;                      // sliced: seconds per phase, 0 while empty
  for (int p : order) {
    int64_t left = demand[p];
    size_t from = 0;  // a pair's next piece goes after its previous one
    const int* const lb = net.pl.data() + net.pl_off[p];
    const int* const le = net.pl.data() + net.pl_off[p + 1];
    while (left > 0) {
      size_t j = words * 64;
      if (words == kWords) {
        uint64_t t[kWords] = {0, 0, 0, 0};
        for (const int* it = lb; it != le; ++it) {
          const uint64_t* u = used.data() + static_cast<size_t>(*it) * kWords;
          t[0] |= u[0];
          t[1] |= u[1];
          t[2] |= u[2];
          t[3] |= u[3];
        }
        for (size_t w = from / 64; w < kWords; ++w) {
          const uint64_t taken = t[w] | (w == from / 64 && from % 64 ? (uint64_t{1} << (from % 64)) - 1 : 0);
          if (~taken != 0) {
            j = w * 64 + static_cast<size_t>(__builtin_ctzll(~taken));
            break;
          }
        }
      } else {
        for (size_t w = from / 64; w < words && j == words * 64; ++w) {
          uint64_t taken = w == from / 64 && from % 64 ? (uint64_t{1} << (from % 64)) - 1 : 0;
          for (const int* it = lb; it != le; ++it) taken |= used[*it * words + w];
          if (~taken != 0) j = w * 64 + static_cast<size_t>(__builtin_ctzll(~taken));
        }
      }
      if (j >= words * 64) {  // grow the bit sets
        j = std::max(words * 64, from);
        const size_t grown = std::max(words + 1, j / 64 + 1);
        std::vector<uint64_t> wider(links * grown, 0);
        for (size_t l = 0; l < links; ++l)
          for (size_t w = 0; w < words; ++w) wider[l * grown + w] = used[l * words + w];
        used.swap(wider);
        words = grown;
      }
      for (const int* it = lb; it != le; ++it) used[*it * words + j / 64] |= uint64_t{1} << (j % 64);
      while (dec.pairs.size() <= j) {
        dec.pairs.emplace_back();
        dec.bytes.emplace_back();
        dec.pairs.back().reserve(static_cast<size_t>(net.n));
        dec.bytes.back().reserve(static_cast<size_t>(net.n));
        span.push_back(0.0);
      }
      int64_t take = left;
      if (sliced) {
        if (span[j] <= 0.0) {
          span[j] = static_cast<double>(left) / net.pair_rate[p];
        } else {
          const double fit = span[j] * net.pair_rate[p];
          if (static_cast<double>(left) > kWholeSlack * fit) take = std::max<int64_t>(1, static_cast<int64_t>(fit));
        }
      }
      dec.unique = dec.unique && take == demand[p];
      dec.pairs[j].push_back(p);
      dec.bytes[j].push_back(take);
      left -= take;
      from = j + 1;
    }
  }
  return dec;
}

}  // namespace

// Past kMaxSimulatedRanks ranks split peer rounds stand in for link-greedy when its work
// budget is exceeded (link_greedy_in_budget()).
bool build_split_peer(PlanSearch* s) {
  if (s->net.n <= kMaxSimulatedRanks || link_greedy_in_budget(*s)) return false;
  const bool sliced = s->model.eta_beta > 0.0 &&
                      static_cast<double>(s->hot.pairs) * s->net.latency_s < kSliceLatencyShare * s->bound_s;
  s->decs.push_back(split_peer_decomposition(s->net, s->demand, s->weight, sliced));
  if (s->bound_unfused(&s->decs.back())) return s->end_with(std::move(s->decs.back()));
  return false;
}

}  // namespace varipath
}  // namespace hoccl
