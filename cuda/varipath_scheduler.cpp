// VarioPath online scheduler (see varipath_scheduler.h).
//
// plan() runs a few greedy decompositions of the demand into channel phases (one per byte
// quantum), then for each considers fusing runs of consecutive phases (fewer phases pay fewer
// start latencies but let flows share links), and returns the candidate with the lowest
// cost-model estimate.  Everything is integer bookkeeping plus fixed-order scans, so every rank
// computes bit-identical plans from the same matrix.
#include "varipath_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>

namespace hoccl {
namespace varipath {

namespace {

std::string pair_name(int p, int n) {
  return "(" + std::to_string(p / n) + ", " + std::to_string(p % n) + ")";
}

// Weight floor so that pairs off the bottleneck still get scheduled by volume.
constexpr double kMinWeight = 0.05;
// A phase led by the bottleneck pair must last at least this fraction of its longest transfer.
constexpr double kMinSpanFraction = 0.25;

}  // namespace

Scheduler::Scheduler(int n, std::vector<std::vector<std::pair<int, int>>> channels,
                     double phase_latency_s, double bandwidth_Bps)
    : n_(n), latency_s_(phase_latency_s), rate_Bps_(bandwidth_Bps) {
  if (n < 1) throw std::invalid_argument("varipath::Scheduler: n must be >= 1, got " + std::to_string(n));
  if (!(phase_latency_s >= 0.0) || !(bandwidth_Bps > 0.0))
    throw std::invalid_argument("varipath::Scheduler: need phase_latency_s >= 0 and bandwidth_Bps > 0");
  pair_chans_.assign(static_cast<size_t>(n) * n, {});
  for (size_t c = 0; c < channels.size(); ++c) {
    std::vector<int> ids;
    for (const auto& sd : channels[c]) {
      if (sd.first < 0 || sd.first >= n || sd.second < 0 || sd.second >= n || sd.first == sd.second)
        throw std::invalid_argument("varipath::Scheduler: channel " + std::to_string(c) +
                                    " has invalid pair (" + std::to_string(sd.first) + ", " +
                                    std::to_string(sd.second) + ") for n=" + std::to_string(n));
      ids.push_back(sd.first * n + sd.second);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int p : ids) pair_chans_[p].push_back(static_cast<int>(chan_pairs_.size()));
    chan_pairs_.push_back(std::move(ids));
  }
  // Default link model: one send and one receive port per GPU at the per-pair rate.
  std::vector<double> bw(2 * static_cast<size_t>(n), bandwidth_Bps);
  std::vector<std::vector<int>> pl(static_cast<size_t>(n) * n);
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d)
      if (s != d) pl[s * n + d] = {s, n + d};
  link_bw_ = std::move(bw);
  pair_links_ = std::move(pl);
}

void Scheduler::set_link_model(std::vector<double> link_bw, std::vector<std::vector<int>> pair_links) {
  if (pair_links.size() != static_cast<size_t>(n_) * n_)
    throw std::invalid_argument("varipath::Scheduler::set_link_model: need n*n pair paths, got " +
                                std::to_string(pair_links.size()));
  for (double b : link_bw)
    if (!(b > 0.0)) throw std::invalid_argument("varipath::Scheduler::set_link_model: link bandwidth must be > 0");
  for (size_t p = 0; p < pair_links.size(); ++p)
    for (int l : pair_links[p])
      if (l < 0 || static_cast<size_t>(l) >= link_bw.size())
        throw std::invalid_argument("varipath::Scheduler::set_link_model: pair " +
                                    pair_name(static_cast<int>(p), n_) + " names link " + std::to_string(l) +
                                    " out of range");
  link_bw_ = std::move(link_bw);
  pair_links_ = std::move(pair_links);
}

void Scheduler::set_cost_model(const CostModel& model) {
  if (model.eta_beta < 0.0 || model.eta_min <= 0.0 || model.eta_min > 1.0 || model.copy_engines < 0)
    throw std::invalid_argument("varipath::Scheduler::set_cost_model: need eta_beta >= 0, 0 < eta_min <= 1, copy_engines >= 0");
  model_ = model;
  eta_table_.assign(static_cast<size_t>(n_) * 4 + 2, 1.0);
  for (size_t k = 2; k < eta_table_.size(); ++k)
    eta_table_[k] = std::max(model_.eta_min, 1.0 - model_.eta_beta * std::log2(static_cast<double>(k)));
}

void Scheduler::validate_demand(const std::vector<int64_t>& demand) const {
  const size_t want = static_cast<size_t>(n_) * n_;
  if (demand.size() != want)
    throw std::invalid_argument("varipath::Scheduler::plan: demand must have n*n = " + std::to_string(want) +
                                " entries (row-major), got " + std::to_string(demand.size()));
  for (size_t p = 0; p < want; ++p) {
    const int s = static_cast<int>(p) / n_, d = static_cast<int>(p) % n_;
    if (s == d) continue;
    if (demand[p] < 0)
      throw std::invalid_argument("varipath::Scheduler::plan: negative demand " + std::to_string(demand[p]) +
                                  " at " + pair_name(static_cast<int>(p), n_));
    if (demand[p] > 0 && pair_chans_[p].empty())
      throw std::invalid_argument("varipath::Scheduler::plan: demand at " + pair_name(static_cast<int>(p), n_) +
                                  " but no channel contains that pair");
  }
}

// Pairs crossing the most loaded links (relative to capacity) are served first: they decide
// the completion time, so every phase should keep those links busy.
std::vector<double> Scheduler::pair_urgency(const std::vector<int64_t>& demand, double* bound_s) const {
  std::vector<double> load(link_bw_.size(), 0.0);
  for (size_t p = 0; p < demand.size(); ++p)
    if (static_cast<int>(p) / n_ != static_cast<int>(p) % n_ && demand[p] > 0)
      for (int l : pair_links_[p]) load[l] += static_cast<double>(demand[p]);
  double top = 0.0;
  for (size_t l = 0; l < load.size(); ++l) top = std::max(top, load[l] / link_bw_[l]);
  *bound_s = top;
  std::vector<double> w(demand.size(), 0.0);
  if (top <= 0.0) return w;
  for (size_t p = 0; p < demand.size(); ++p) {
    double u = 0.0;
    for (int l : pair_links_[p]) u = std::max(u, load[l] / link_bw_[l]);
    w[p] = kMinWeight + u / top;
  }
  return w;
}

// Phase length (seconds): set by the channel's most urgent pair (the one on the most loaded
// link), so the bottleneck link is busy for the whole phase and other pairs only fill it.  If
// that pair has just a small remainder, fall back to the longest pair to avoid short phases.
double Scheduler::phase_span(const std::vector<int>& chan, const std::vector<int64_t>& left,
                             const std::vector<int64_t>& cap, const std::vector<double>& rate,
                             const std::vector<double>& weight) const {
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
std::vector<std::vector<int>> Scheduler::decompose(const std::vector<int64_t>& demand,
                                                   const std::vector<double>& weight, int64_t quantum,
                                                   bool scale_by_rate,
                                                   std::vector<std::vector<int64_t>>* bytes) const {
  // Per-pair cap: the quantum scaled by the pair's full rate, so a phase's transfers take
  // about the same time (a slow cross-socket pair gets fewer bytes than a local one).
  std::vector<int64_t> cap(demand.size(), quantum);
  std::vector<double> rate(demand.size(), rate_Bps_);
  for (size_t p = 0; p < demand.size(); ++p) {
    for (int l : pair_links_[p]) rate[p] = std::min(rate[p], link_bw_[l]);
    cap[p] = scale_by_rate ? std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(quantum) * (rate[p] / rate_Bps_)))
                           : quantum;
  }
  std::vector<int64_t> left(demand.size(), 0);
  int64_t total = 0;
  for (size_t p = 0; p < demand.size(); ++p)
    if (static_cast<int>(p) / n_ != static_cast<int>(p) % n_) {
      left[p] = demand[p];
      total += demand[p];
    }
  std::vector<double> score(chan_pairs_.size(), 0.0);
  for (size_t c = 0; c < chan_pairs_.size(); ++c)
    for (int p : chan_pairs_[c]) score[c] += weight[p] * static_cast<double>(std::min(left[p], cap[p]));
  // Lazy max-heap of (score, -channel): scores only decrease, so an entry whose score still
  // matches is the true maximum; ties go to the lowest channel index (deterministic).
  std::priority_queue<std::pair<double, int>> heap;
  for (size_t c = 0; c < score.size(); ++c) heap.push({score[c], -static_cast<int>(c)});
  std::vector<std::vector<int>> phases;
  while (total > 0) {
    while (heap.top().first != score[-heap.top().second]) {
      const int c = -heap.top().second;
      heap.pop();
      heap.push({score[c], -c});
    }
    const size_t best = static_cast<size_t>(-heap.top().second);
    // Whole-pair passes keep pairs intact; sliced passes time phases by the bottleneck pair.
    const double span = scale_by_rate ? phase_span(chan_pairs_[best], left, cap, rate, weight)
                                      : std::numeric_limits<double>::infinity();
    std::vector<int> pairs;
    std::vector<int64_t> amount;
    for (int p : chan_pairs_[best]) {
      if (left[p] <= 0) continue;
      const int64_t fit = std::isinf(span) ? left[p] : std::max<int64_t>(1, static_cast<int64_t>(span * rate[p]));
      const int64_t before = std::min(std::min(left[p], cap[p]), fit);
      left[p] -= before;
      total -= before;
      const double delta = weight[p] * static_cast<double>(before - std::min(left[p], cap[p]));
      for (int c : pair_chans_[p]) score[c] -= delta;
      pairs.push_back(p);
      amount.push_back(before);
    }
    if (pairs.empty()) {  // rounding residue left a stale positive score: recompute it exactly
      double exact = 0.0;
      for (int p : chan_pairs_[best]) exact += weight[p] * static_cast<double>(std::min(left[p], cap[p]));
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

// Scratch link tables reused across phases; only touched entries are reset, so costing a
// phase is O(transfers * path length), not O(links).
struct Scheduler::LinkScratch {
  std::vector<double> load;
  std::vector<double> sq;   // sum of squared flow sizes: gives the effective flow count
  std::vector<int> flows;
  std::vector<int> touched;
  explicit LinkScratch(size_t links) : load(links, 0.0), sq(links, 0.0), flows(links, 0) {}
};

void Scheduler::add_transfer(LinkScratch* ls, int pair, int64_t bytes, bool new_flow) const {
  for (int l : pair_links_[pair]) {
    if (ls->flows[l] == 0 && ls->load[l] == 0.0) ls->touched.push_back(l);
    ls->load[l] += static_cast<double>(bytes);
    ls->sq[l] += static_cast<double>(bytes) * static_cast<double>(bytes);
    if (new_flow) ls->flows[l] += 1;
  }
}

// eta(k) of the contention model, tabulated (log2 per link and phase showed up in profiles).
double Scheduler::eta(int k) const {
  if (model_.eta_beta <= 0.0) return 1.0;
  if (static_cast<size_t>(k) < eta_table_.size()) return eta_table_[k];
  return std::max(model_.eta_min, 1.0 - model_.eta_beta * std::log2(static_cast<double>(k)));
}

// Drains the scratch: returns the phase's start latency plus its most congested link's time
// (bandwidth derated by eta(k) under the contention model).
double Scheduler::drain_cost(LinkScratch* ls) const {
  if (ls->touched.empty()) return 0.0;
  double worst = 0.0;
  for (int l : ls->touched) {
    // Flows of unequal size leave the link one by one, so contention is charged for the
    // load-weighted (participation-ratio) flow count (sum b)^2 / sum b^2, not the initial count.
    const double k_eff = ls->sq[l] > 0.0 ? ls->load[l] * ls->load[l] / ls->sq[l] : 1.0;
    const int k = std::min(ls->flows[l], std::max(1, static_cast<int>(std::lround(k_eff))));
    const double cap = link_bw_[l] * (k > 1 ? eta(k) : 1.0);
    worst = std::max(worst, ls->load[l] / cap);
    ls->load[l] = 0.0;
    ls->sq[l] = 0.0;
    ls->flows[l] = 0;
  }
  ls->touched.clear();
  return latency_s_ + worst;
}

double Scheduler::phase_cost(const Phase& phase) const {
  LinkScratch ls(link_bw_.size());
  for (const Transfer& t : phase) add_transfer(&ls, t.src * n_ + t.dst, t.bytes, true);
  return drain_cost(&ls);
}

double Scheduler::estimate(const std::vector<Phase>& phases) const {
  double total = 0.0;
  for (const Phase& ph : phases) total += phase_cost(ph);
  return total;
}

// Cost of fusing runs of `merge` channel phases, without building the phases.  A pair repeated
// inside a run counts as one flow (as materialize() merges it).
double Scheduler::merged_cost(const std::vector<std::vector<int>>& chans,
                              const std::vector<std::vector<int64_t>>& bytes, int merge, LinkScratch* ls,
                              std::vector<int>* seen, int* stamp) const {
  double total = 0.0;
  for (size_t start = 0; start < chans.size(); start += merge) {
    ++*stamp;
    const size_t stop = std::min(chans.size(), start + static_cast<size_t>(merge));
    for (size_t i = start; i < stop; ++i)
      for (size_t k = 0; k < chans[i].size(); ++k) {
        const int p = chans[i][k];
        const bool fresh = (*seen)[p] != *stamp;
        (*seen)[p] = *stamp;
        add_transfer(ls, p, bytes[i][k], fresh);
      }
    total += drain_cost(ls);
  }
  return total;
}

std::vector<Phase> Scheduler::materialize(const std::vector<std::vector<int>>& chans,
                                          const std::vector<std::vector<int64_t>>& bytes, int merge) const {
  std::vector<Phase> out;
  std::vector<int> slot(static_cast<size_t>(n_) * n_, -1);
  for (size_t start = 0; start < chans.size(); start += merge) {
    Phase ph;
    const size_t stop = std::min(chans.size(), start + static_cast<size_t>(merge));
    for (size_t i = start; i < stop; ++i)
      for (size_t k = 0; k < chans[i].size(); ++k) {
        const int p = chans[i][k];
        if (slot[p] < 0) {
          slot[p] = static_cast<int>(ph.size());
          ph.push_back(Transfer{static_cast<int32_t>(p / n_), static_cast<int32_t>(p % n_), 0});
        }
        ph[slot[p]].bytes += bytes[i][k];
      }
    for (const Transfer& t : ph) slot[t.src * n_ + t.dst] = -1;
    out.push_back(std::move(ph));
  }
  return out;
}

std::vector<Phase> Scheduler::peer_rounds(const std::vector<int64_t>& demand) const {
  std::vector<Phase> out;
  for (int k = 1; k < n_; ++k) {
    Phase ph;
    for (int s = 0; s < n_; ++s) {
      const int d = (s + k) % n_;
      if (demand[s * n_ + d] > 0) ph.push_back(Transfer{s, d, demand[s * n_ + d]});
    }
    if (!ph.empty()) out.push_back(std::move(ph));
  }
  return out;
}

std::vector<Phase> Scheduler::plan(const std::vector<int64_t>& demand) const {
  return plan_info(demand, nullptr);
}

std::vector<Phase> Scheduler::plan_info(const std::vector<int64_t>& demand, PlanInfo* info) const {
  validate_demand(demand);
  int64_t top = 0;
  for (size_t p = 0; p < demand.size(); ++p)
    if (static_cast<int>(p) / n_ != static_cast<int>(p) % n_) top = std::max(top, demand[p]);
  if (info) *info = PlanInfo{};
  if (top == 0) return {};
  double bound_s = 0.0;
  const std::vector<double> weight = pair_urgency(demand, &bound_s);
  // Quanta: whole pairs per phase (few phases), or slices of the bottleneck time so that the
  // bottleneck link stays busy in every phase even when a few pairs dominate (skew).
  const double lb_bytes = bound_s * rate_Bps_;
  std::vector<int64_t> quanta = {top};
  for (double k : {1.0}) {
    const int64_t q = static_cast<int64_t>(std::ceil(lb_bytes / (k * n_)));
    if (q > 0 && q < top && std::find(quanta.begin(), quanta.end(), q) == quanta.end()) quanta.push_back(q);
  }
  LinkScratch ls(link_bw_.size());
  std::vector<int> seen(demand.size(), 0);
  int stamp = 0;
  double best_cost = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int>> best_chans;
  std::vector<std::vector<int64_t>> best_bytes;
  int best_merge = 1;
  int64_t best_q = top;
  for (int64_t q : quanta) {
    std::vector<std::vector<int64_t>> bytes;
    auto chans = decompose(demand, weight, q, q != top, &bytes);
    const int count = static_cast<int>(chans.size());
    // Merge factors 1, 2, 4, ... all phases; the cost is unimodal in practice, so stop once it
    // has risen twice in a row.  "All" is always tried: it is the single-phase (direct) plan.
    double prev = std::numeric_limits<double>::infinity();
    double serial = 0.0;  // cost with merge factor 1
    int rises = 0, chosen = 0;
    double chosen_cost = std::numeric_limits<double>::infinity();
    for (int merge = 1;; merge *= 2) {
      const int m = std::min(merge, count);
      if (rises < 2 || m == count) {
        double cost;
        if (model_.copy_engines > 0 && m > 1) {
          // Copy-engine queues: a fused phase runs its channels partly one after another
          // (C transfers per source at a time, in channel order), so it is only partly
          // credited with the link sharing a fluid model would give it.
          // Blend with the fluid estimate: queues overlap some of the channels' transfers.
          const int groups = (count + m - 1) / m;
          const double queued = serial - static_cast<double>(count - groups) * latency_s_;
          cost = 0.5 * (queued + merged_cost(chans, bytes, m, &ls, &seen, &stamp));
        } else {
          cost = merged_cost(chans, bytes, m, &ls, &seen, &stamp);
        }
        if (m == 1) serial = cost;
        rises = cost > prev ? rises + 1 : 0;
        prev = cost;
        if (cost < chosen_cost * (1.0 - 1e-12)) {
          chosen_cost = cost;
          chosen = m;
        }
      }
      if (m >= count) break;
    }
    if (chosen_cost < best_cost * (1.0 - 1e-12)) {
      best_cost = chosen_cost;
      best_chans = std::move(chans);
      best_bytes = std::move(bytes);
      best_merge = chosen;
      best_q = q;
    }
  }
  // Peer rounds (NCCL-style pairwise exchange) as one more candidate: when the catalog's
  // channels cannot beat them under the cost model, use them.
  std::vector<Phase> rounds = peer_rounds(demand);
  const double rounds_cost = estimate(rounds);
  if (rounds_cost < best_cost * (1.0 - 1e-9)) {
    if (info) *info = PlanInfo{rounds_cost, static_cast<int>(rounds.size()), 1, 0.0, 1};
    return rounds;
  }
  if (info)
    *info = PlanInfo{best_cost, static_cast<int>(best_chans.size()), best_merge, static_cast<double>(best_q), 0};
  return materialize(best_chans, best_bytes, best_merge);
}

}  // namespace varipath
}  // namespace hoccl
