// Link-greedy: phases built from the link model with at most one transfer per directed link,
// the workhorse family (exact costs under every model).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"
#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

namespace {

// Under eta, a remainder goes whole only while it stretches the phase by at most this many start
// latencies: at bandwidth-bound sizes 20 % of a long phase idles its busiest links for far
// longer than the later phase a sliver might cost (in the benchmark more cases reach the 1.15x
// floor that way, and the two that do not lose 0.7 %).  Without eta the sliver's sharing is
// free, so the slack stays.
constexpr double kWholeStretchLatencies = 1.0;
// Backfilled plans are built only when the hot link's pairs, one start latency each, need at most
// this share of the lower bound: below, fused runs win (no 1 MB case of the benchmark changed,
// while backfilling cost 8-ranks plans 10-15 us there).
constexpr double kBackfillLatencyShare = 1.0;
// Past kMaxSimulatedRanks ranks the link-greedy pass is built only when its work (about the
// busiest link's pair count, i.e. its phases, times the pairs it scans per phase) fits this
// budget; otherwise split peer rounds replace it.  (64 ranks: 112 x 4032 pairs, several
// milliseconds, is over it.)
constexpr double kLinkGreedyWork = 65536.0;

// Link-greedy decomposition: each phase is built directly from the link model, at most one
// flow per directed link, so every flow runs alone at its full rate under every simulator
// model (no eta derating, no copy-engine queueing).  Pairs are taken in order of urgency, the
// sum of squared remaining times of the links on their path: the busiest links dominate, and
// among pairs on equally busy bottlenecks those crossing several of them go first, so the links
// that decide the completion time are busy in every phase.  The phase lasts as long as the
// most urgent pair's slice (`quantum` bytes scaled by its rate); every other pair sends what
// fits in that span.  Unlike decompose() this is not limited to the catalog's working set: any
// set of pairs with disjoint links is contention-free.
std::vector<std::vector<int>> link_greedy(const Network& net, const ModelTables& model, const std::vector<int64_t>& demand,
                                          int64_t quantum, std::vector<std::vector<int64_t>>* bytes) {
  const std::vector<double>& rate = net.pair_rate;
  std::vector<int64_t> left(demand.size(), 0);
  std::vector<double> link_left(net.link_bw.size(), 0.0);  // bytes still to cross each link
  std::vector<int> active;
  int64_t top = 0;
  for (size_t p = 0; p < demand.size(); ++p) {
    if (net.pair_src[p] == net.pair_dst[p] || demand[p] <= 0) continue;
    left[p] = demand[p];
    top = std::max(top, demand[p]);
    active.push_back(static_cast<int>(p));
    for (int l : net.links_of(p)) link_left[l] += static_cast<double>(demand[p]);
  }
  std::vector<int> busy(net.link_bw.size(), -1);  // phase index that holds the link
  // Sort keys: the urgency's bit pattern complemented (urgencies are sums of squares, >= +0, whose
  // bit patterns order like their values: descending urgency), then the pair id (ties to the
  // lowest); one unsigned 128-bit compare instead of a (double, int) pair compare.
  using Key = unsigned __int128;
  auto key_of = [](double u, int p) {
    uint64_t bits;
    std::memcpy(&bits, &u, sizeof bits);
    return (static_cast<Key>(~bits) << 32) | static_cast<uint32_t>(p);
  };
  auto pair_of = [](Key k) { return static_cast<int>(static_cast<uint32_t>(k)); };
  std::vector<Key> order;
  std::vector<double> x2(net.link_bw.size(), 0.0);
  std::vector<std::vector<int>> phases;
  // Urgencies drift slowly from phase to phase; with many ranks re-sorting every phase is the
  // planner's largest cost, so the order is refreshed every n/16 phases (finished pairs
  // skipped), every n/4 past kMaxSimulatedRanks ranks.
  const int resort_every = net.n > kMaxSimulatedRanks ? net.n / 4 : std::max(1, net.n / 16);
  const bool masked = !net.pair_mask.empty();
  const bool padded = !net.pair_path8.empty();
  x2.push_back(0.0);  // the padding link of pair_path8_
  while (!active.empty()) {
    const int phase = static_cast<int>(phases.size());
    if (phase % resort_every == 0) {
      for (size_t l = 0; l < net.link_bw.size(); ++l) {
        const double x = link_left[l] / net.link_bw[l];
        x2[l] = x * x;
      }
      // Re-key the previous order (finished pairs dropped) and insertion-sort it: urgencies
      // drift little between refreshes, so it is nearly sorted (keys are unique: the order is
      // the same as a full sort's).
      size_t kept = 0;
      for (const Key entry : order)
        if (left[pair_of(entry)] > 0) order[kept++] = entry;
      order.resize(kept);
      const bool first = order.empty();
      if (first)
        for (int p : active) order.push_back(key_of(0.0, p));
      if (padded) {
        // Fixed-length paths padded with a link whose x2 is 0 (adding 0.0 changes no sum):
        // no branch on the path length.
        for (Key& entry : order) {
          const int p = pair_of(entry);
          const int* pl = net.pair_path8.data() + static_cast<size_t>(p) * 8;
          double u = 0.0;
          for (int k = 0; k < 8; ++k) u += x2[pl[k]];
          entry = key_of(u, p);  // ascending: most urgent first, then lowest pair id
        }
      } else {
        for (Key& entry : order) {
          const int p = pair_of(entry);
          double u = 0.0;
          for (int l : net.links_of(p)) u += x2[l];
          entry = key_of(u, p);  // ascending: most urgent first, then lowest pair id
        }
      }
      if (first) std::sort(order.begin(), order.end());
      for (size_t i = 1; i < order.size() && !first; ++i) {
        const auto key = order[i];
        size_t j = i;
        for (; j > 0 && key < order[j - 1]; --j) order[j] = order[j - 1];
        order[j] = key;
      }
    }
    int lead = -1;
    for (const Key entry : order)
      if (left[pair_of(entry)] > 0) {
        lead = pair_of(entry);
        break;
      }
    // Slices scale with the lead's rate (equal-time slices); a quantum above the largest demand
    // sends the lead's whole remainder (phases as long as the slowest whole pair).
    const double lead_cap = quantum > top ? static_cast<double>(left[lead])
                                          : static_cast<double>(quantum) * (rate[lead] / net.rate_Bps);
    const double span = std::min(static_cast<double>(left[lead]), std::max(1.0, lead_cap)) / rate[lead];
    std::vector<int> pairs;
    std::vector<int64_t> amount;
    pairs.reserve(order.size());
    amount.reserve(order.size());
    uint64_t busy_mask = 0;  // links taken in this phase, when they fit in 64 bits
    for (const Key entry : order) {
      const int p = pair_of(entry);
      if (left[p] == 0) continue;
      bool free = true;
      if (masked)
        free = (net.pair_mask[p] & busy_mask) == 0;
      else
        for (int l : net.links_of(p)) free = free && busy[l] != phase;
      if (!free) continue;
      // A remainder within kWholeSlack of the span goes whole: a sliver would cost a phase later.
      const double fit = span * rate[p];
      const double whole = model.eta_beta > 0.0
                               ? std::min(kWholeSlack * fit, fit + rate[p] * net.latency_s * kWholeStretchLatencies)
                               : kWholeSlack * fit;
      const int64_t take = static_cast<double>(left[p]) <= whole
                               ? left[p]
                               : std::max<int64_t>(1, static_cast<int64_t>(fit));
      if (masked) busy_mask |= net.pair_mask[p];
      for (int l : net.links_of(p)) {
        busy[l] = phase;
        link_left[l] -= static_cast<double>(take);
      }
      left[p] -= take;
      pairs.push_back(p);
      amount.push_back(take);
    }
    active.erase(std::remove_if(active.begin(), active.end(), [&](int p) { return left[p] == 0; }), active.end());
    phases.push_back(std::move(pairs));
    bytes->push_back(std::move(amount));
  }
  return phases;
}

// Quanta: whole pairs per phase (few phases), or slices of the bottleneck time so that the
// bottleneck link stays busy in every phase even when a few pairs dominate (skew).
// Past kMaxSimulatedRanks ranks only the slice is planned (each pass costs phases x pairs).
std::vector<int64_t> quanta(const Network& net, int64_t top, double bound_s) {
  const int64_t slice = static_cast<int64_t>(std::ceil(bound_s * net.rate_Bps / net.n));
  const bool sliced = slice > 0 && slice < top;
  if (sliced && net.n > kMaxSimulatedRanks) return {slice};
  return sliced ? std::vector<int64_t>{top, slice} : std::vector<int64_t>{top};
}

// Quanta of the link-greedy passes: with the largest demand as quantum a slow lead
// (cross-socket) still gets a rate-scaled slice; one more pass (quantum above the largest
// demand) lets it go whole, which keeps uniform cross-socket pairs in one piece.
std::vector<int64_t> link_passes(const Network& net, const std::vector<int64_t>& qs, int64_t top) {
  std::vector<int64_t> passes = qs;
  if (net.n <= kMaxSimulatedRanks && qs.front() == top) passes.insert(passes.begin(), top + 1);
  return passes;
}

Decomposition link_decomposition(const Network& net, const ModelTables& model, const std::vector<int64_t>& demand,
                                 int64_t quantum, int64_t top) {
  Decomposition dec;
  dec.pairs = link_greedy(net, model, demand, quantum, &dec.bytes);
  dec.quantum = std::min(quantum, top);
  dec.family = kLinkGreedy;
  dec.disjoint = true;
  return dec;
}

}  // namespace

bool link_greedy_in_budget(const PlanSearch& s) {
  return s.net.n <= kMaxSimulatedRanks ||
         static_cast<double>(s.hot.pairs) * static_cast<double>(s.active_pairs) <= kLinkGreedyWork;
}

// One pass per quantum, each bounded as it is built.  Under eta each pass is also offered
// backfilled (backfill()), unfused only: its fused runs stay built from the plain pass, whose
// phases fuse better (the backfilled ones, fused, lost up to 3 % at 1-16 MB).  They go after the
// plain passes: decs.front() is the time-sharing search's start, which the plain phases seed
// better (gen4 hot4-50 256 MB: 1.034x against 1.077x the lower bound).
bool build_link_greedy(PlanSearch* s) {
  if (!link_greedy_in_budget(*s)) return false;
  const Network& net = s->net;
  const ModelTables& model = s->model;
  const bool backfilled = (s->candidates & kBackfill) && model.eta_beta > 0.0 && model.copy_engines == 0 &&
                          net.n <= kMaxSimulatedRanks &&
                          static_cast<double>(s->hot.pairs) * net.latency_s <= kBackfillLatencyShare * s->bound_s;
  std::vector<Decomposition> filled;
  for (int64_t q : link_passes(net, quanta(net, s->top, s->bound_s), s->top)) {
    s->decs.push_back(link_decomposition(net, model, s->demand, q, s->top));
    if (s->bound_unfused(&s->decs.back())) return s->end_with(std::move(s->decs.back()));
    if (!backfilled) continue;
    Decomposition extra = s->decs.back();
    if (!backfill(net, model, &extra)) continue;
    extra.backfilled = true;
    if (s->bound_unfused(&extra)) return s->end_with(std::move(extra));
    filled.push_back(std::move(extra));
  }
  for (Decomposition& dec : filled) s->decs.push_back(std::move(dec));
  return false;
}

}  // namespace varipath
}  // namespace hoccl
