// Catalog channels: greedy covers of the demand by the offline catalog's contention-free channels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"
#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

namespace {

// A phase led by the bottleneck pair must last at least this fraction of its longest transfer.
constexpr double kMinSpanFraction = 0.25;
// The catalog pass is built only when the best exact link-greedy plan exceeds the cost model's
// lower bound by more than this fraction (below it, catalog plans rarely won by > 1 %).
constexpr double kCatalogGain = 0.05;

// Phase length (seconds): set by the channel's most urgent pair (the one on the most loaded
// link), so the bottleneck link is busy for the whole phase and other pairs only fill it.  If
// that pair has just a small remainder, fall back to the longest pair to avoid short phases.
double phase_span(const std::vector<int>& chan, const std::vector<int64_t>& left, const std::vector<int64_t>& cap,
                  const std::vector<double>& rate, const std::vector<double>& weight) {
  int star = -1;
  double longest = 0.0;
  for (int p : chan) {
    if (left[p] <= 0) continue;
    const double t = static_cast<double>(std::min(left[p], cap[p])) / rate[p];
    longest = std::max(longest, t);
    if (star < 0 || weight[p] > weight[star] || (weight[p] == weight[star] && left[p] > left[star])) star = p;
  }
  if (star < 0) return 0.0;
  const double t_star = static_cast<double>(std::min(left[star], cap[star])) / rate[star];
  return t_star >= kMinSpanFraction * longest ? t_star : longest;
}

// One greedy pass: repeatedly take the channel that moves the most urgency-weighted bytes
// (each pair capped at `quantum` per phase).  Channel scores are updated incrementally through
// the pair -> channels index, so a pass costs O(phases * channels + moved pairs * multiplicity).
std::vector<std::vector<int>> decompose(const Network& net, const std::vector<int64_t>& demand,
                                        const std::vector<double>& weight, int64_t quantum, bool scale_by_rate,
                                        std::vector<std::vector<int64_t>>* bytes) {
  // Per-pair cap: the quantum scaled by the pair's full rate, so a phase's transfers take
  // about the same time (a slow cross-socket pair gets fewer bytes than a local one).
  // (Whole-pair passes use neither: every cap is the quantum.)
  std::vector<int64_t> cap(demand.size(), quantum);
  std::vector<double> rate;
  if (scale_by_rate) {
    rate.assign(demand.size(), net.rate_Bps);
    for (size_t p = 0; p < demand.size(); ++p) {
      for (int l : net.links_of(p)) rate[p] = std::min(rate[p], net.link_bw[l]);
      cap[p] = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(quantum) * (rate[p] / net.rate_Bps)));
    }
  }
  std::vector<int64_t> left(demand.size(), 0);
  int64_t total = 0;
  for (size_t p = 0; p < demand.size(); ++p)
    if (net.pair_src[p] != net.pair_dst[p]) {
      left[p] = demand[p];
      total += demand[p];
    }
  std::vector<double> score(net.chan_pairs.size(), 0.0);
  for (size_t c = 0; c < net.chan_pairs.size(); ++c)
    for (int p : net.chan_pairs[c]) score[c] += weight[p] * static_cast<double>(std::min(left[p], cap[p]));
  // The channel with the highest score, ties to the lowest index (deterministic): a linear scan
  // per phase (a few hundred channels) is cheaper than keeping a heap of decreasing scores.
  std::vector<std::vector<int>> phases;
  while (total > 0) {
    // The largest score in four independent running maxima (no loop-carried compare chain),
    // then its first index: the same channel as a single scan.
    const size_t nc = score.size();
    double m4[4] = {score[0], score[0], score[0], score[0]};
    size_t c = 0;
    for (; c + 4 <= nc; c += 4)
      for (int k = 0; k < 4; ++k) m4[k] = score[c + k] > m4[k] ? score[c + k] : m4[k];
    for (; c < nc; ++c) m4[0] = score[c] > m4[0] ? score[c] : m4[0];
    const double top_score = std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
    size_t best = 0;
    while (score[best] != top_score) ++best;
    // Whole-pair passes keep pairs intact; sliced passes time phases by the bottleneck pair.
    const double span = scale_by_rate ? phase_span(net.chan_pairs[best], left, cap, rate, weight)
                                      : std::numeric_limits<double>::infinity();
    std::vector<int> pairs;
    std::vector<int64_t> amount;
    pairs.reserve(net.chan_pairs[best].size());
    amount.reserve(net.chan_pairs[best].size());
    for (int p : net.chan_pairs[best]) {
      if (left[p] <= 0) continue;
      const int64_t fit = std::isinf(span) ? left[p] : std::max<int64_t>(1, static_cast<int64_t>(span * rate[p]));
      const int64_t before = std::min(std::min(left[p], cap[p]), fit);
      left[p] -= before;
      total -= before;
      const double delta = weight[p] * static_cast<double>(before - std::min(left[p], cap[p]));
      for (int c : net.pair_chans[p]) score[c] -= delta;
      pairs.push_back(p);
      amount.push_back(before);
    }
    if (pairs.empty()) {  // rounding residue left a stale positive score: recompute it exactly
      double exact = 0.0;
      for (int p : net.chan_pairs[best]) exact += weight[p] * static_cast<double>(std::min(left[p], cap[p]));
      if (exact >= score[best]) throw std::logic_error("varipath::Scheduler: greedy pass made no progress");
      score[best] = exact;
      continue;
    }
    score[best] = std::max(score[best], 0.0);
    phases.push_back(std::move(pairs));
    bytes->push_back(std::move(amount));
  }
  return phases;
}

}  // namespace

// The catalog pass scores every working-set channel per phase, the largest planning cost on
// few ranks: it runs only when the link-greedy plan leaves room (without eta), and not past
// kCatalogMaxRanks ranks, where it costs more planning time than its plans save.
bool build_catalog_channels(PlanSearch* s) {
  const bool may_pay = s->best_exact > (1.0 + kCatalogGain) * s->floor_s && s->model.eta_beta <= 0.0;
  if (!((may_pay && s->net.n <= kCatalogMaxRanks) || s->candidates == kCatalogChannels)) return false;
  s->decs.emplace_back();
  Decomposition& dec = s->decs.back();
  dec.pairs = decompose(s->net, s->demand, s->weight, s->top, false, &dec.bytes);
  dec.quantum = s->top;
  dec.family = kCatalogChannels;
  return false;
}

}  // namespace varipath
}  // namespace hoccl
