// VarioPath online scheduler (see varipath_scheduler.h).
//
// plan() runs a few greedy decompositions of the demand into channel phases (one per byte
// quantum), then for each considers fusing runs of consecutive phases (fewer phases pay fewer
// start latencies but let flows share links), and returns the candidate with the lowest
// cost-model estimate.  Everything is integer bookkeeping plus fixed-order scans, so every rank
// computes bit-identical plans from the same matrix.
#include "varipath/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>

namespace hoccl {
namespace varipath {

namespace {

// splitmix64 finaliser: candidate signatures (identical fused phases are costed once).
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string pair_name(int p, int n) {
  return "(" + std::to_string(p / n) + ", " + std::to_string(p % n) + ")";
}

// Weight floor so that pairs off the bottleneck still get scheduled by volume.
constexpr double kMinWeight = 0.05;
// A phase led by the bottleneck pair must last at least this fraction of its longest transfer.
constexpr double kMinSpanFraction = 0.25;
// At most this many candidates per plan are costed with the event model (in bound order).
constexpr int kMaxSimulated = 4;
// Link-greedy: a pair whose remainder is within this factor of what fits in the phase's span
// sends it whole (a cross-socket pair at 20 GB/s next to 25 GB/s pairs stretches the phase by
// up to 20 % instead of leaving a sliver that costs a whole phase later).
constexpr double kWholeSlack = 1.2;
// Under eta, a remainder goes whole only while it stretches the phase by at most this many start
// latencies: at bandwidth-bound sizes 20 % of a long phase idles its busiest links for far
// longer than the later phase a sliver might cost (35 -> 33 misses of the 1.15x floor, 30
// cases faster, 2 slower by 0.7 %).  Without eta the sliver's sharing is free, so the slack stays.
constexpr double kWholeStretchLatencies = 1.0;
// backfill(): a budget of link checks per decomposition (a count, never a clock).
constexpr double kBackfillWork = 131072.0;
// Backfilled plans are built only when the hot link's pairs, one start latency each, need at most
// this share of the lower bound: below, fused runs win (no 1 MB case of the benchmark changed,
// while backfilling cost 8-ranks plans 10-15 us there).
constexpr double kBackfillLatencyShare = 1.0;
// See Scheduler::worth_fusing().
constexpr double kFuseLatencyShare = 0.03;
// Event-model budget per candidate, see Scheduler::affordable().
constexpr std::size_t kMaxSimulatedPhaseFlows = 1024;
constexpr std::size_t kMaxSimulatedFlows = 4096;
constexpr int kMaxSimulatedRanks = 32;
// Past kMaxSimulatedRanks ranks the link-greedy pass is built only when its work (about the
// busiest link's pair count, i.e. its phases, times the pairs it scans per phase) fits this
// budget; otherwise split peer rounds replace it.  A count of operations, never a clock, so every
// rank decides alike.  (64 ranks: 112 x 4032 pairs, several milliseconds, is over it.)
constexpr double kLinkGreedyWork = 65536.0;
// Split peer rounds: pairs whose busiest link carries at least this share of the busiest link's
// load are placed first.
constexpr double kHotShare = 0.5;
// Past kMaxSimulatedRanks ranks at most this many fused candidates are bounded (each bound is a
// pass over the plan's transfers), best floor first; one more with copy-engine queues, where the
// one-phase plan and the runs of 8 peer rounds are both needed (see kQueueMargin).
constexpr int kFusedBoundPasses = 2;
constexpr int kFusedBoundPassesQueued = 3;
// Past kMaxSimulatedRanks ranks candidates are ranked by their bounds, and the bounds of fused
// phases are optimistic where the event model would see what they miss:
// - with copy-engine queues, fused split peer rounds queue whole pairs of unequal length per
//   source; their bound (busiest link) ignores how the queues drift out of step, which cost
//   0-37 % in one phase at 64 ranks (skewed traffic worst: every source starts on the hot
//   receivers) and up to 18 % in runs of 8 at 256 ranks, while runs of 8 peer rounds (one
//   transfer per source per round, in step) stayed within 3 % of their bound.  Fused split
//   rounds are charged kQueueMargin more, so they win only when clearly better;
// - under contention the smallest-first eta drain of a fused run was 3-10 % below the simulated
//   time (more the more phases are fused: 4 % for pairs of phases at 256 ranks, 10 % for runs
//   of 8 at 64), so a fused run that is not exact is charged kFusedMargin per doubling of its
//   merge factor (2.5 % for 2, 7.5 % for 8).
constexpr double kQueueMargin = 0.08;
// See plan_info() (split rounds sliced).
constexpr double kSliceLatencyShare = 0.05;
constexpr double kFusedMargin = 0.025;
// Past kMaxSimulatedRanks ranks fused runs are bounded up to this many channel phases, and all
// in one (each merge factor's bound costs a pass over the plan).
constexpr int kMaxMergeManyRanks = 8;
// See decompositions().
constexpr int kCatalogMaxRanks = 16;
// Time-sharing plans are built only when one start latency per transfer stays under this share
// of the plan's lower bound (256 MB per rank and up on direct4): their phases (up to one per
// pair) pay start latencies that the LP does not see, and building and costing one takes
// 0.2-0.4 ms of planning on the CI VM, which the 3-9 % shorter plans repay only on long exchanges.
constexpr double kTimeShareLatencyShare = 0.01;
// Past 4 GPUs, up to kTimeShareSearchRanks, time-sharing plans come from column generation,
// built when one start latency per pair is at most kTimeShareSearchLatencyShare of the plan's
// lower bound (256 MB per rank and up on the 8-GPU presets, exchanges of 17 ms and more).  Its
// pricing rounds are budgeted by the stakes: about kTimeSharePlanShare of that lower bound at
// kTimeShareRoundCostS per round (a round's planning time on 8 GPUs measured on the CI VM:
// 25-37 us since the LP keeps its columns sparse, 120 us before; a count, never a clock, so
// every rank decides alike), at most kTimeShareRounds.
constexpr int kTimeShareSearchRanks = 8;
constexpr int kTimeShareRounds = 96;
constexpr double kTimeShareSearchLatencyShare = 0.03;
constexpr double kTimeSharePlanShare = 0.03;
constexpr double kTimeShareRoundCostS = 35e-6;
// An exact plan within this fraction of the cost model's lower bound ends the search.
constexpr double kGoodEnough = 0.015;
// A simulated plan within kGoodEnough of the plan floor ends the search only while that margin
// is at most kGoodEnoughAbs seconds (about one more 8-rank simulation's planning time): past
// it the plan time a later candidate might save outweighs the planning time saved.
constexpr double kGoodEnoughAbs = 25e-6;
// The catalog pass is built only when the best exact link-greedy plan exceeds the cost model's
// lower bound by more than this fraction (below it, catalog plans rarely won by > 1 %).
constexpr double kCatalogGain = 0.05;
// Relative margin of screening tests done with multiplications by reciprocals (a few ulps
// off the exact divisions); values inside it are decided by the exact division.
constexpr double kScreen = 1e-9;
// merged_bound(): flow sizes kept per link while adding a group's transfers, up to this many
// flows per link (else they are gathered from the flows afterwards).
constexpr int kOnLink = 8;
// merged_bound(): a group touching at least 1 / kDenseShare of the links scans all of them.
constexpr size_t kDenseShare = 4;
// Peer rounds' early-stop floors: at most this many of the most loaded links (see peer_loads()).
constexpr int kPeerFloorLinks = 64;
// The unfused peer-round pass past the best bound only decides worth_fusing(): the per-round
// upper bound (peer_upper_rounds(), one walk over the transfers) is built to show it when
// peer_upper_simple() is within kPeerTableReach of the pass's stop, and the rounds' floor reaches
// kPeerTableFloor of the best bound (then, stopped at the best bound, the pass ends early).
constexpr double kPeerTableReach = 4.0;
constexpr double kPeerTableFloor = 0.9;

}  // namespace

Scheduler::Scheduler(int n, std::vector<std::vector<std::pair<int, int>>> channels,
                     double phase_latency_s, double bandwidth_Bps)
    : n_(n), latency_s_(phase_latency_s), rate_Bps_(bandwidth_Bps) {
  if (n < 1) throw std::invalid_argument("varipath::Scheduler: n must be >= 1, got " + std::to_string(n));
  if (!(phase_latency_s >= 0.0) || !(bandwidth_Bps > 0.0))
    throw std::invalid_argument("varipath::Scheduler: need phase_latency_s >= 0 and bandwidth_Bps > 0");
  pair_chans_.assign(static_cast<size_t>(n) * n, {});
  pair_src_.resize(static_cast<size_t>(n) * n);  // pair id p = s * n + d -> s, d (no division per use)
  pair_dst_.resize(static_cast<size_t>(n) * n);
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      pair_src_[static_cast<size_t>(s) * n + d] = s;
      pair_dst_[static_cast<size_t>(s) * n + d] = d;
    }
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
  index_links();
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
  index_links();
  build_time_share();
}

void Scheduler::set_cost_model(const CostModel& model) {
  if (model.eta_beta < 0.0 || model.eta_min <= 0.0 || model.eta_min > 1.0 || model.copy_engines < 0)
    throw std::invalid_argument("varipath::Scheduler::set_cost_model: need eta_beta >= 0, 0 < eta_min <= 1, copy_engines >= 0");
  model_ = model;
  eta_table_.assign(static_cast<size_t>(n_) * 4 + 2, 1.0);
  for (size_t k = 2; k < eta_table_.size(); ++k)
    eta_table_[k] = std::max(model_.eta_min, 1.0 - model_.eta_beta * std::log2(static_cast<double>(k)));
  inv_eta_table_.resize(eta_table_.size());
  for (size_t k = 0; k < eta_table_.size(); ++k) inv_eta_table_[k] = 1.0 / eta_table_[k];
  // log2 grows with k, so once the table's last entry is at the floor eta_min every larger k is
  // too (a link shared by more flows than the table covers then costs no log2 call).
  const double last = static_cast<double>(eta_table_.size() - 1);
  eta_floored_ = model_.eta_beta > 0.0 && 1.0 - model_.eta_beta * std::log2(last) <= model_.eta_min;
  build_time_share();
}

// The configuration table of time-sharing plans: only under eta (without it one phase with the
// whole demand is already optimal, and copy-engine queues make rates depend on the order) and
// for at most TimeShareTable::kMaxPairs pairs (4 GPUs: 4095 configurations).
void Scheduler::build_time_share() {
  timeshare_.reset();
  const int pairs = n_ * (n_ - 1);
  if (model_.eta_beta <= 0.0 || model_.copy_engines > 0 || pairs < 2 || pairs > TimeShareTable::kMaxPairs) return;
  std::vector<int> ids;
  std::vector<std::vector<int>> links;
  for (int p = 0; p < n_ * n_; ++p) {
    if (pair_src_[p] == pair_dst_[p]) continue;
    ids.push_back(p);
    links.push_back(pair_links_[p]);
  }
  timeshare_ = std::make_shared<const TimeShareTable>(std::move(ids), links, link_bw_, eta_upto(pairs));
}

// eta(0..flows) as a table (time sharing: a link carries at most every transfer at once).
std::vector<double> Scheduler::eta_upto(int flows) const {
  std::vector<double> table(static_cast<size_t>(flows) + 1, 1.0);
  for (size_t k = 2; k < table.size(); ++k) table[k] = eta(static_cast<int>(k));
  return table;
}

void Scheduler::set_hosts(std::vector<int> host_of_gpu) {
  if (host_of_gpu.size() != static_cast<size_t>(n_))
    throw std::invalid_argument("varipath::Scheduler::set_hosts: need one host per GPU (" + std::to_string(n_) +
                                "), got " + std::to_string(host_of_gpu.size()));
  int hosts = 0;
  for (int h : host_of_gpu) {
    if (h < 0 || h >= n_) throw std::invalid_argument("varipath::Scheduler::set_hosts: host index out of range");
    hosts = std::max(hosts, h + 1);
  }
  host_size_.assign(hosts, 0);
  local_index_.assign(n_, 0);
  for (int g = 0; g < n_; ++g) local_index_[g] = host_size_[host_of_gpu[g]]++;
  for (int h = 0; h < hosts; ++h)
    if (host_size_[h] == 0) throw std::invalid_argument("varipath::Scheduler::set_hosts: host " + std::to_string(h) + " has no GPU");
  host_of_ = std::move(host_of_gpu);
  hosts_ = hosts;
}

void Scheduler::set_candidates(int mask) {
  const int families = kCatalogChannels | kLinkGreedy | kPeerRounds | kDirect | kTimeShare | kHostRounds;
  if ((mask & families) == 0 || (mask & ~(families | kBackfill)) != 0)
    throw std::invalid_argument("varipath::Scheduler::set_candidates: mask must name at least one of "
                                "1 (catalog channels), 2 (link greedy), 4 (peer rounds), 8 (direct), "
                                "32 (time sharing), 64 (host rounds), plus optionally 128 (backfilled "
                                "link greedy), got " + std::to_string(mask));
  candidates_ = mask;
}

void Scheduler::validate_demand(const std::vector<int64_t>& demand) const {
  const size_t want = static_cast<size_t>(n_) * n_;
  if (demand.size() != want)
    throw std::invalid_argument("varipath::Scheduler::plan: demand must have n*n = " + std::to_string(want) +
                                " entries (row-major), got " + std::to_string(demand.size()));
  for (size_t p = 0; p < want; ++p) {
    const int s = pair_src_[p], d = pair_dst_[p];
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
std::vector<double> Scheduler::pair_urgency(const std::vector<int64_t>& demand, double* bound_s,
                                            std::vector<double>* load_out) const {
  std::vector<double>& load = *load_out;
  load.assign(link_bw_.size(), 0.0);
  // Each link's bytes.  When the whole demand is under 2^53 bytes every partial sum is an exact
  // integer in double precision, so the sums are taken in int64 (one-cycle adds, no chain of
  // dependent floating-point adds through memory): the same values.
  uint64_t total = 0;
  bool small = true;
  for (size_t p = 0; p < demand.size(); ++p)
    if (pair_src_[p] != pair_dst_[p] && demand[p] > 0) {
      total += static_cast<uint64_t>(demand[p]);
      small = small && total < (uint64_t{1} << 53);
    }
  if (small) {
    std::vector<int64_t> sum(link_bw_.size(), 0);
    for (size_t p = 0; p < demand.size(); ++p)
      if (pair_src_[p] != pair_dst_[p] && demand[p] > 0)
        for (int l : links_of(p)) sum[l] += demand[p];
    for (size_t l = 0; l < load.size(); ++l) load[l] = static_cast<double>(sum[l]);
  } else {
    for (size_t p = 0; p < demand.size(); ++p)
      if (pair_src_[p] != pair_dst_[p] && demand[p] > 0)
        for (int l : links_of(p)) load[l] += static_cast<double>(demand[p]);
  }
  double top = 0.0;
  for (size_t l = 0; l < load.size(); ++l) top = std::max(top, load[l] / link_bw_[l]);
  *bound_s = top;
  std::vector<double> w(demand.size(), 0.0);
  if (top <= 0.0) return w;
  std::vector<double> busy(load.size() + 1, 0.0);  // each link's time, divided once (0 past the end)
  for (size_t l = 0; l < load.size(); ++l) busy[l] = load[l] / link_bw_[l];
  if (!pair_path8_.empty()) {
    // Paths padded to 8 links with the index past the end (busy 0): a max tree, no loop.
    const int* path = pair_path8_.data();
    const double* b = busy.data();
    for (size_t p = 0; p < demand.size(); ++p, path += 8) {
      const double u = std::max(std::max(std::max(b[path[0]], b[path[1]]), std::max(b[path[2]], b[path[3]])),
                                std::max(std::max(b[path[4]], b[path[5]]), std::max(b[path[6]], b[path[7]])));
      w[p] = kMinWeight + std::max(u, 0.0) / top;
    }
    return w;
  }
  for (size_t p = 0; p < demand.size(); ++p) {
    double u = 0.0;
    for (int l : links_of(p)) u = std::max(u, busy[l]);
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
  // (Whole-pair passes use neither: every cap is the quantum.)
  std::vector<int64_t> cap(demand.size(), quantum);
  std::vector<double> rate;
  if (scale_by_rate) {
    rate.assign(demand.size(), rate_Bps_);
    for (size_t p = 0; p < demand.size(); ++p) {
      for (int l : links_of(p)) rate[p] = std::min(rate[p], link_bw_[l]);
      cap[p] = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(quantum) * (rate[p] / rate_Bps_)));
    }
  }
  std::vector<int64_t> left(demand.size(), 0);
  int64_t total = 0;
  for (size_t p = 0; p < demand.size(); ++p)
    if (pair_src_[p] != pair_dst_[p]) {
      left[p] = demand[p];
      total += demand[p];
    }
  std::vector<double> score(chan_pairs_.size(), 0.0);
  for (size_t c = 0; c < chan_pairs_.size(); ++c)
    for (int p : chan_pairs_[c]) score[c] += weight[p] * static_cast<double>(std::min(left[p], cap[p]));
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
    const double span = scale_by_rate ? phase_span(chan_pairs_[best], left, cap, rate, weight)
                                      : std::numeric_limits<double>::infinity();
    std::vector<int> pairs;
    std::vector<int64_t> amount;
    pairs.reserve(chan_pairs_[best].size());
    amount.reserve(chan_pairs_[best].size());
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

// Scratch tables reused across phases; only touched entries are reset, so costing a phase is
// O(transfers * path length), not O(links).  A phase's transfers are also kept as flows (one
// per pair, in first-appearance order, as materialize() emits them) for the event model.
struct Scheduler::LinkScratch {
  std::vector<double> load;
  std::vector<int> flows;
  std::vector<int> touched;
  std::vector<int> flow_pair;      // the phase's flows
  std::vector<double> flow_bytes;
  std::vector<int> slot;           // pair -> index in flow_pair, -1 when absent
  std::vector<int> per_source;     // event model: flows started per source GPU
  std::vector<std::vector<double>> sizes_on;  // event model: the hot link's flow sizes (one buffer)
  // Event model, links by local index (position in `touched`): each flow's local links and
  // each local link's flows (built once per phase), running flows per link, and per solve the
  // capacity left, unfrozen flows and fair share of the links that carry running flows.
  std::vector<int> link_id;
  std::vector<int> flow_off, flow_links, link_off, link_flows;
  std::vector<int> act, unfrozen, open;
  std::vector<double> cap0, cap_left, rem;
  std::vector<double> rate, left;
  std::vector<char> state;         // per flow: 0 queued, 1 running, 2 done
  std::vector<int> running, next_run;
  std::vector<int> src_next, src_head;  // copy engines: next flow of the same source; each source's first queued flow
  std::vector<double> lbw;              // bandwidth of each local link
  std::vector<char> need;  // bound: shared links whose flow sizes are gathered
  std::vector<int> needed, bucket_at;  // bound: those links; where each one's next size goes
  std::vector<double> needed_u;        // bound: each needed link's upper end (load / (bw x eta(flows)))
  std::vector<int> near_top;           // bound: shared links whose upper end is near the busiest plain time
  std::vector<double> bucket;          // bound: their flow sizes, one segment per link
  std::vector<double> left_load;       // bound, early stop: each link's bytes in the groups to come
  std::vector<double> group_bound;     // bound, early stop: each group's bound (summed in plan order)
  std::vector<int> mb_pair, mb_touched;  // bound: the group's flows (pair, bytes) and touched links
  std::vector<double> mb_bytes;
  std::vector<double> on_link;         // bound: each link's flow sizes, kOnLink slots per link
  std::vector<int> flow_rank;          // bound: each flow's slot on each of its links (8 per flow)
  explicit LinkScratch(size_t links, size_t pairs, size_t gpus)
      : load(links, 0.0), flows(links, 0), slot(pairs, -1), per_source(gpus, 0), sizes_on(1),
        link_id(links, 0), src_head(gpus, -1), need(links, 0), bucket_at(links, 0) {}
};

void Scheduler::add_transfer(LinkScratch* ls, int pair, int64_t bytes, bool /*new_flow*/) const {
  int& at = ls->slot[pair];
  const bool fresh = at < 0;
  if (fresh) {
    at = static_cast<int>(ls->flow_pair.size());
    ls->flow_pair.push_back(pair);
    ls->flow_bytes.push_back(0.0);
  }
  ls->flow_bytes[at] += static_cast<double>(bytes);
  for (int l : links_of(pair)) {
    if (ls->flows[l] == 0 && ls->load[l] == 0.0) ls->touched.push_back(l);
    ls->load[l] += static_cast<double>(bytes);
    if (fresh) ls->flows[l] += 1;
  }
}

// 1 / eta(k), for screening (see merged_bound()).
double Scheduler::inv_eta(int k) const {
  if (static_cast<size_t>(k) < inv_eta_table_.size()) return inv_eta_table_[k];
  return 1.0 / eta(k);
}

// eta(k) of the contention model, tabulated (log2 per link and phase showed up in profiles).
double Scheduler::eta(int k) const {
  if (model_.eta_beta <= 0.0) return 1.0;
  if (static_cast<size_t>(k) < eta_table_.size()) return eta_table_[k];
  if (eta_floored_) return model_.eta_min;
  return std::max(model_.eta_min, 1.0 - model_.eta_beta * std::log2(static_cast<double>(k)));
}

// Event model of one phase under the contention / copy-engine model, as the simulator runs it:
// max-min-fair rates by progressive filling (each link's bandwidth derated by eta(flows on it)
// under contention), re-solved at each completion, when the flow counts drop (and, with copy
// engines, the source's next queued transfer starts, in phase order).  Unlike a per-link load
// bound it sees a flow stuck behind a busy link or queued behind its source's other transfers.
// The phase's link tables are built once; a solve then costs O(running flows x path +
// bottleneck iterations x links still open).  The bytes left on each link are tracked too: no
// link moves more than its bandwidth, so the time so far plus the busiest link's bytes left
// over its bandwidth is a lower bound on the phase; once it reaches `limit` the phase cannot
// fit (the caller then discards the candidate) and the simulation stops there.
double Scheduler::event_time(LinkScratch* ls, double limit) const {
  const size_t nf = ls->flow_pair.size();
  const size_t nl = ls->touched.size();
  const int engines = model_.copy_engines;
  // Link tables: local link ids in first-touch order, flow -> local links, link -> flows.
  ls->act.assign(nl, 0);
  ls->rem.resize(nl);
  ls->lbw.resize(nl);
  for (size_t i = 0; i < nl; ++i) {
    ls->link_id[ls->touched[i]] = static_cast<int>(i);
    ls->rem[i] = ls->load[ls->touched[i]];
    ls->lbw[i] = link_bw_[ls->touched[i]];
  }
  const double* lbw = ls->lbw.data();
  // Flow and link tables in flat buffers written by index (no push_back in the event loop).
  size_t nfl = 0;
  for (size_t f = 0; f < nf; ++f) nfl += static_cast<size_t>(pl_off_[ls->flow_pair[f] + 1] - pl_off_[ls->flow_pair[f]]);
  ls->flow_off.resize(nf + 1);
  ls->flow_links.resize(nfl);
  ls->link_off.assign(nl + 1, 0);
  {
    int* flw = ls->flow_links.data();
    int* loff = ls->link_off.data();
    const int* lid = ls->link_id.data();
    int at = 0;
    for (size_t f = 0; f < nf; ++f) {
      ls->flow_off[f] = at;
      for (int l : links_of(ls->flow_pair[f])) {
        const int i = lid[l];
        flw[at++] = i;
        loff[i + 1] += 1;
      }
    }
    ls->flow_off[nf] = at;
    for (size_t i = 0; i < nl; ++i) loff[i + 1] += loff[i];
  }
  ls->link_flows.resize(nfl);
  ls->open.assign(ls->link_off.begin(), ls->link_off.end() - 1);  // fill cursors
  for (size_t f = 0; f < nf; ++f)
    for (int k = ls->flow_off[f]; k < ls->flow_off[f + 1]; ++k) ls->link_flows[ls->open[ls->flow_links[k]]++] = static_cast<int>(f);
  const int* fl = ls->flow_links.data();
  const int* foff = ls->flow_off.data();
  ls->cap0.resize(nl);
  ls->cap_left.resize(nl);
  ls->unfrozen.resize(nl);
  ls->open.resize(nl);
  ls->left.assign(ls->flow_bytes.begin(), ls->flow_bytes.end());
  ls->rate.assign(nf, 0.0);
  ls->state.assign(nf, 0);
  ls->running.resize(nf);
  ls->next_run.resize(nf);
  // Local views of the scratch (stores through the char state table would otherwise make the
  // compiler reload every table's address).
  int* act = ls->act.data();
  double* rem = ls->rem.data();
  double* cap0 = ls->cap0.data();
  double* cap_left = ls->cap_left.data();
  int* unfrozen = ls->unfrozen.data();
  int* openl = ls->open.data();
  double* left = ls->left.data();
  double* rate = ls->rate.data();
  char* state = ls->state.data();
  int* running = ls->running.data();
  int* next_run = ls->next_run.data();
  int* per_source = ls->per_source.data();
  int* src_head = ls->src_head.data();
  const int* flow_pair = ls->flow_pair.data();
  const int* loff = ls->link_off.data();
  const int* lflows = ls->link_flows.data();
  const int* psrc = pair_src_.data();
  size_t nrun = 0;
  // With copy engines flows start in list order per source: each source's queued flows are
  // chained (src_next, built back to front) from its first queued one (src_head).
  if (engines > 0) {
    ls->src_next.resize(nf);
    for (size_t f = nf; f-- > 0;) {
      const int src = psrc[flow_pair[f]];
      ls->src_next[f] = src_head[src];
      src_head[src] = static_cast<int>(f);
    }
  }
  const int* src_next = engines > 0 ? ls->src_next.data() : nullptr;
  for (size_t f = 0; f < nf; ++f) {
    const int src = psrc[flow_pair[f]];
    if (engines > 0 && per_source[src] >= engines) continue;
    if (engines > 0) src_head[src] = src_next[f];  // started: the chain moves on
    per_source[src] += 1;
    running[nrun++] = static_cast<int>(f);
    state[f] = 1;
    for (int k = foff[f]; k < foff[f + 1]; ++k) act[fl[k]] += 1;
  }
  constexpr double kDone = std::numeric_limits<double>::infinity();
  double t = 0.0;
  while (nrun > 0 && t < limit) {
    // Max-min-fair rates of the running flows (classic bottleneck iteration: the link with the
    // smallest fair share of its remaining capacity fixes the rate of its unfrozen flows; their
    // rates come off their other links).
    size_t nopen = 0;
    for (size_t i = 0; i < nl; ++i) {
      const int a = act[i];
      if (a == 0) continue;
      cap0[i] = lbw[i] * (a > 1 ? eta(a) : 1.0);
      cap_left[i] = cap0[i];
      unfrozen[i] = a;
      openl[nopen++] = static_cast<int>(i);
    }
    for (size_t r = 0; r < nrun; ++r) rate[running[r]] = -1.0;
    size_t open = nrun;
    while (open > 0) {
      // The first open link (local order) with the smallest share; links with no unfrozen flow
      // left are dropped from the open list on the way (order kept).
      // (A link's share, what is left of its capacity over its unfrozen flows, only changes
      // when one of its flows is frozen; computing it here is the same value.)
      // Shares are compared by cross-multiplication (no division per link; the counts are
      // positive): cap_i / u_i < cap_n / u_n  <=>  cap_i * u_n < cap_n * u_i.
      size_t kept = 0;
      int neck = -1;
      double neck_cap = 0.0, neck_u = 1.0;
      for (size_t o = 0; o < nopen; ++o) {
        const int i = openl[o];
        const int u = unfrozen[i];
        if (u == 0) continue;
        openl[kept++] = i;
        const double c = cap_left[i], du = static_cast<double>(u);
        if (neck < 0 || c * neck_u < neck_cap * du) {
          neck = i;
          neck_cap = c;
          neck_u = du;
        }
      }
      nopen = kept;
      const double low = neck_cap / neck_u;
      const double level = std::max(low, 0.0);
      for (int k = loff[neck]; k < loff[neck + 1]; ++k) {
        const int f = lflows[k];
        if (state[f] != 1 || rate[f] >= 0.0) continue;
        rate[f] = level;
        --open;
        for (int j = foff[f]; j < foff[f + 1]; ++j) {
          const int i = fl[j];
          cap_left[i] -= level;
          unfrozen[i] -= 1;
        }
      }
    }
    // The step: the smallest left / rate (compared by cross-multiplication, one division).
    double dt_left = 0.0, dt_rate = 0.0;
    bool first = true;
    for (size_t r = 0; r < nrun; ++r) {
      const int f = running[r];
      const double l = left[f], rt = rate[f];
      if (first || l * dt_rate < dt_left * rt) {
        dt_left = l;
        dt_rate = rt;
        first = false;
      }
    }
    const double dt = first ? kDone : dt_left / dt_rate;
    t += dt;
    // Bytes moved on each link in this step (what its flows used of its capacity).
    for (size_t i = 0; i < nl; ++i)
      if (act[i] > 0) rem[i] -= (cap0[i] - cap_left[i]) * dt;
    size_t nnext = 0;
    for (size_t r = 0; r < nrun; ++r) {
      const int f = running[r];
      left[f] -= rate[f] * dt;
      // Flows within 0.1 % of the step finish together (as the simulator's RTOL does).
      if (left[f] > rate[f] * dt * 1e-3) {
        next_run[nnext++] = f;
        continue;
      }
      state[f] = 2;
      for (int k = foff[f]; k < foff[f + 1]; ++k) {
        act[fl[k]] -= 1;
        rem[fl[k]] -= left[f];
      }
      if (engines > 0) {  // the freed copy engine takes this source's next queued transfer
        const int src = psrc[flow_pair[f]];
        per_source[src] -= 1;
        const int g = src_head[src];
        if (g >= 0) {
          next_run[nnext++] = g;
          state[g] = 1;
          for (int k = foff[g]; k < foff[g + 1]; ++k) act[fl[k]] += 1;
          per_source[src] += 1;
          src_head[src] = src_next[g];
        }
      }
    }
    std::swap(running, next_run);
    nrun = nnext;
    if (limit < kDone && nrun > 0) {
      // Lower bound on what is left: the busiest link's bytes over its bandwidth or, under
      // contention, that link's flows drained smallest first at bandwidth * eta(flows left), as
      // merged_bound() does; less 0.2 % (flows within 0.1 % of a step finish early, rounding).
      double rest = 0.0;
      int hot = -1;
      for (size_t i = 0; i < nl; ++i) {
        const double x = rem[i] * inv_bw_[ls->touched[i]];
        if (x > rest) {
          rest = x;
          hot = static_cast<int>(i);
        }
      }
      if (hot >= 0 && model_.eta_beta > 0.0 && t + rest * (1.0 - 2e-3) < limit) {
        std::vector<double>& sz = ls->sizes_on[0];
        sz.clear();
        for (int k = loff[hot]; k < loff[hot + 1]; ++k) {
          const int f = lflows[k];
          if (state[f] != 2) sz.push_back(state[f] == 1 ? left[f] : ls->flow_bytes[f]);
        }
        std::sort(sz.begin(), sz.end());
        const double bw = link_bw_[ls->touched[hot]];
        double drain = 0.0;
        for (size_t i = 0; i < sz.size(); ++i) drain += sz[i] / (bw * eta(static_cast<int>(sz.size() - i)));
        sz.clear();
        rest = std::max(rest, drain);
      }
      if (t + rest * (1.0 - 2e-3) >= limit) {
        t = std::max(limit, t);
        break;
      }
    }
  }
  for (size_t f = 0; f < nf; ++f) {
    ls->per_source[pair_src_[ls->flow_pair[f]]] = 0;
    if (engines > 0) ls->src_head[pair_src_[ls->flow_pair[f]]] = -1;
  }
  return t;
}

// Drains the scratch: returns the phase's start latency plus its data time.  When every link
// carries at most one flow (and no source queues), flows run alone and the most loaded link's
// time is exact under every model; so it is under `fluid`, where max-min sharing keeps the
// bottleneck link busy.  Otherwise the event model above estimates the phase.
double Scheduler::drain_cost(LinkScratch* ls, double limit) const {
  if (ls->touched.empty()) return 0.0;
  double worst = 0.0;
  bool shared = false;
  for (int l : ls->touched) {
    worst = std::max(worst, ls->load[l] / link_bw_[l]);
    shared = shared || ls->flows[l] > 1;
  }
  if (model_.copy_engines > 0 && !shared) {  // the default link model has one send port per GPU,
    for (int p : ls->flow_pair) shared = shared || ++ls->per_source[pair_src_[p]] > model_.copy_engines;
    for (int p : ls->flow_pair) ls->per_source[pair_src_[p]] = 0;  // but a custom one may not
  }
  const bool sharing_costs = model_.eta_beta > 0.0 || model_.copy_engines > 0;
  const double data = shared && sharing_costs ? event_time(ls, limit - latency_s_) : worst;
  reset_scratch(ls);
  return latency_s_ + data;
}

void Scheduler::reset_scratch(LinkScratch* ls) const {
  for (int l : ls->touched) {
    ls->load[l] = 0.0;
    ls->flows[l] = 0;
  }
  ls->touched.clear();
  for (int p : ls->flow_pair) ls->slot[p] = -1;
  ls->flow_pair.clear();
  ls->flow_bytes.clear();
}

double Scheduler::phase_cost(const Phase& phase) const {
  LinkScratch ls(link_bw_.size(), pair_links_.size(), static_cast<size_t>(n_));
  for (const Transfer& t : phase) add_transfer(&ls, t.src * n_ + t.dst, t.bytes, true);
  return drain_cost(&ls, std::numeric_limits<double>::infinity());
}

double Scheduler::estimate(const std::vector<Phase>& phases) const {
  double total = 0.0;
  for (const Phase& ph : phases) total += phase_cost(ph);
  return total;
}

// Cost of fusing runs of `merge` channel phases, without building the phases.  A pair repeated
// inside a run counts as one flow (as materialize() merges it).  Once the cost provably reaches
// `limit` (what the candidate must beat) the rest is not simulated and +inf is returned.
double Scheduler::merged_cost(const std::vector<std::vector<int>>& chans,
                              const std::vector<std::vector<int64_t>>& bytes, int merge, LinkScratch* ls,
                              double limit, const std::vector<double>* group_bounds) const {
  double total = 0.0;
  const size_t groups = (chans.size() + merge - 1) / merge;
  // Lower bounds of the groups still to come: their merged_bound() values when given, else
  // their start latencies.
  const bool bounded = group_bounds && group_bounds->size() == groups;
  double rest = 0.0;
  if (bounded)
    for (double b : *group_bounds) rest += b;
  for (size_t g = 0, start = 0; start < chans.size(); start += merge, ++g) {
    if (bounded) {
      rest -= (*group_bounds)[g];
      rest = std::max(rest, 0.0);
      if (total + (*group_bounds)[g] + rest >= limit) return std::numeric_limits<double>::infinity();
    } else {
      rest = latency_s_ * static_cast<double>(groups - g - 1);
    }
    const size_t stop = std::min(chans.size(), start + static_cast<size_t>(merge));
    for (size_t i = start; i < stop; ++i)
      for (size_t k = 0; k < chans[i].size(); ++k) add_transfer(ls, chans[i][k], bytes[i][k], true);
    // The event model stops once this group's share of `limit` is spent; then the sum below
    // reaches `limit` too.
    total += drain_cost(ls, limit - total - rest);
    if (total + rest >= limit) return std::numeric_limits<double>::infinity();
  }
  return total;
}

std::vector<Phase> Scheduler::materialize(const std::vector<std::vector<int>>& chans,
                                          const std::vector<std::vector<int64_t>>& bytes, int merge) const {
  std::vector<Phase> out;
  out.reserve((chans.size() + merge - 1) / merge);
  if (merge == 1) {  // every decomposition names a pair at most once per channel phase
    for (size_t i = 0; i < chans.size(); ++i) {
      Phase ph;
      ph.reserve(chans[i].size());
      for (size_t k = 0; k < chans[i].size(); ++k) {
        const int p = chans[i][k];
        ph.push_back(Transfer{static_cast<int32_t>(pair_src_[p]), static_cast<int32_t>(pair_dst_[p]), bytes[i][k]});
      }
      out.push_back(std::move(ph));
    }
    return out;
  }
  std::vector<int> slot(static_cast<size_t>(n_) * n_, -1);
  for (size_t start = 0; start < chans.size(); start += merge) {
    Phase ph;
    const size_t stop = std::min(chans.size(), start + static_cast<size_t>(merge));
    size_t most = 0;  // transfers before merging repeated pairs: enough room
    for (size_t i = start; i < stop; ++i) most += chans[i].size();
    ph.reserve(most);
    for (size_t i = start; i < stop; ++i)
      for (size_t k = 0; k < chans[i].size(); ++k) {
        const int p = chans[i][k];
        if (slot[p] < 0) {
          slot[p] = static_cast<int>(ph.size());
          ph.push_back(Transfer{static_cast<int32_t>(pair_src_[p]), static_cast<int32_t>(pair_dst_[p]), 0});
        }
        ph[slot[p]].bytes += bytes[i][k];
      }
    for (const Transfer& t : ph) slot[t.src * n_ + t.dst] = -1;
    out.push_back(std::move(ph));
  }
  return out;
}

std::vector<Phase> Scheduler::plan(const std::vector<int64_t>& demand) const {
  return plan_info(demand, nullptr);
}

// Full rate of each pair running alone: the narrowest link on its path (capped by the per-pair rate).
void Scheduler::index_links() {
  pl_off_.assign(pair_links_.size() + 1, 0);
  pl_.clear();
  pair_rate_.assign(pair_links_.size(), rate_Bps_);
  pair_min_bw_.assign(pair_links_.size(), std::numeric_limits<double>::infinity());
  inv_bw_.resize(link_bw_.size());
  for (size_t l = 0; l < link_bw_.size(); ++l) inv_bw_[l] = 1.0 / link_bw_[l];
  const bool masks = link_bw_.size() <= 64;
  pair_mask_.assign(masks ? pair_links_.size() : 0, 0);
  for (size_t p = 0; p < pair_links_.size(); ++p) {
    for (int l : pair_links_[p]) {
      pl_.push_back(l);
      pair_rate_[p] = std::min(pair_rate_[p], link_bw_[l]);
      pair_min_bw_[p] = std::min(pair_min_bw_[p], link_bw_[l]);
      if (masks) pair_mask_[p] |= uint64_t{1} << l;
    }
    pl_off_[p + 1] = static_cast<int>(pl_.size());
  }
  // Link -> pairs crossing it (in pair order, a pair once per occurrence on its path).
  lp_off_.assign(link_bw_.size() + 1, 0);
  for (int l : pl_) lp_off_[l + 1] += 1;
  for (size_t l = 0; l < link_bw_.size(); ++l) lp_off_[l + 1] += lp_off_[l];
  lp_.assign(pl_.size(), 0);
  std::vector<int> fill(lp_off_.begin(), lp_off_.end() - 1);
  for (size_t p = 0; p < pair_links_.size(); ++p)
    for (int l : pair_links_[p]) lp_[fill[l]++] = static_cast<int>(p);
  // Per link, the most pairs one peer round puts on it (for peer_upper_simple()).
  round_flows_.assign(link_bw_.size(), 0);
  {
    std::vector<int> cnt(link_bw_.size(), 0);
    for (int k = 1; k < n_; ++k) {
      std::fill(cnt.begin(), cnt.end(), 0);
      for (int s = 0; s < n_; ++s)
        for (int l : links_of(s * n_ + (s + k) % n_)) cnt[l] += 1;
      for (size_t l = 0; l < cnt.size(); ++l) round_flows_[l] = std::max(round_flows_[l], cnt[l]);
    }
  }
  // Paths padded to 8 links with link index L (one past the last), when none is longer.
  size_t longest = 0;
  for (const auto& path : pair_links_) longest = std::max(longest, path.size());
  pair_path8_.assign(longest <= 8 ? pair_links_.size() * 8 : 0, static_cast<int>(link_bw_.size()));
  if (longest <= 8)
    for (size_t p = 0; p < pair_links_.size(); ++p)
      for (size_t k = 0; k < pair_links_[p].size(); ++k) pair_path8_[p * 8 + k] = pair_links_[p][k];
}

// Link-greedy decomposition: each phase is built directly from the link model, at most one
// flow per directed link, so every flow runs alone at its full rate under every simulator
// model (no eta derating, no copy-engine queueing).  Pairs are taken in order of urgency, the
// sum of squared remaining times of the links on their path: the busiest links dominate, and
// among pairs on equally busy bottlenecks those crossing several of them go first, so the links
// that decide the completion time are busy in every phase.  The phase lasts as long as the
// most urgent pair's slice (`quantum` bytes scaled by its rate); every other pair sends what
// fits in that span.  Unlike decompose() this is not limited to the catalog's working set: any
// set of pairs with disjoint links is contention-free.
std::vector<std::vector<int>> Scheduler::link_greedy(const std::vector<int64_t>& demand, int64_t quantum,
                                                     std::vector<std::vector<int64_t>>* bytes) const {
  const std::vector<double>& rate = pair_rate_;
  std::vector<int64_t> left(demand.size(), 0);
  std::vector<double> link_left(link_bw_.size(), 0.0);  // bytes still to cross each link
  std::vector<int> active;
  int64_t top = 0;
  for (size_t p = 0; p < demand.size(); ++p) {
    if (pair_src_[p] == pair_dst_[p] || demand[p] <= 0) continue;
    left[p] = demand[p];
    top = std::max(top, demand[p]);
    active.push_back(static_cast<int>(p));
    for (int l : links_of(p)) link_left[l] += static_cast<double>(demand[p]);
  }
  std::vector<int> busy(link_bw_.size(), -1);  // phase index that holds the link
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
  std::vector<double> x2(link_bw_.size(), 0.0);
  std::vector<std::vector<int>> phases;
  // Urgencies drift slowly from phase to phase; with many ranks re-sorting every phase is the
  // planner's largest cost, so the order is refreshed every n/16 phases (finished pairs
  // skipped), every n/4 past kMaxSimulatedRanks ranks.
  const int resort_every = n_ > kMaxSimulatedRanks ? n_ / 4 : std::max(1, n_ / 16);
  const bool masked = !pair_mask_.empty();
  const bool padded = !pair_path8_.empty();
  x2.push_back(0.0);  // the padding link of pair_path8_
  while (!active.empty()) {
    const int phase = static_cast<int>(phases.size());
    if (phase % resort_every == 0) {
      for (size_t l = 0; l < link_bw_.size(); ++l) {
        const double x = link_left[l] / link_bw_[l];
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
          const int* pl = pair_path8_.data() + static_cast<size_t>(p) * 8;
          double u = 0.0;
          for (int k = 0; k < 8; ++k) u += x2[pl[k]];
          entry = key_of(u, p);  // ascending: most urgent first, then lowest pair id
        }
      } else {
        for (Key& entry : order) {
          const int p = pair_of(entry);
          double u = 0.0;
          for (int l : links_of(p)) u += x2[l];
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
                                          : static_cast<double>(quantum) * (rate[lead] / rate_Bps_);
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
        free = (pair_mask_[p] & busy_mask) == 0;
      else
        for (int l : links_of(p)) free = free && busy[l] != phase;
      if (!free) continue;
      // A remainder within kWholeSlack of the span goes whole: a sliver would cost a phase later.
      const double fit = span * rate[p];
      const double whole = model_.eta_beta > 0.0
                               ? std::min(kWholeSlack * fit, fit + rate[p] * latency_s_ * kWholeStretchLatencies)
                               : kWholeSlack * fit;
      const int64_t take = static_cast<double>(left[p]) <= whole
                               ? left[p]
                               : std::max<int64_t>(1, static_cast<int64_t>(fit));
      if (masked) busy_mask |= pair_mask_[p];
      for (int l : links_of(p)) {
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


// Lower bound of merged_cost(): per group, the start latency plus, for every link, the time to
// drain its flows if they left smallest first (each step at bandwidth * eta(flows still on the
// link)), which no sharing can beat.  Exact when no link carries two flows (and no source
// queues): then every flow runs alone.  *exact reports whether every group was exact.
//
// Early stop (fused runs, hot given): the groups still to come cost at least their start
// latencies plus the time to drain the hot link's bytes left in them (a group's bound is at
// least that link's smallest-first eta drain, see floor_at()); once the groups done plus that exceed `stop`, or
// `stop_inexact` after a group that is not exact (the candidate then pays its margins), the
// candidate cannot win and +inf is returned (*exact false).
double Scheduler::merged_bound(const Decomposition& dec, int merge, LinkScratch* ls, bool* exact,
                               uint64_t* signature, std::vector<double>* group_bounds, const HotLink* hot,
                               double stop, double stop_inexact, const std::vector<double>* floor_prefix) const {
  if (group_bounds) group_bounds->clear();
  double total = 0.0;
  *exact = true;
  uint64_t sig = 0;
  const bool sharing_costs = model_.eta_beta > 0.0 || model_.copy_engines > 0;
  if (dec.disjoint && merge == 1) {
    // Every phase carries at most one transfer per link (so each pair at most once): the
    // busiest link's time is the largest transfer over its path's narrowest link (the same
    // division as below), and no link is shared; only copy-engine queues can make it inexact.
    for (size_t i = 0; i < dec.pairs.size(); ++i) {
      double worst = 0.0;
      uint64_t group = 0;
      bool queued = false;
      for (size_t k = 0; k < dec.pairs[i].size(); ++k) {
        const int p = dec.pairs[i][k];
        const double b = static_cast<double>(dec.bytes[i][k]);
        if (links_of(p).begin() != links_of(p).end()) worst = std::max(worst, b / pair_min_bw_[p]);
        if (signature) {
          const uint64_t h = mix64((static_cast<uint64_t>(p) << 40) ^ static_cast<uint64_t>(b));
          group = model_.copy_engines > 0 ? mix64(group ^ h) : group + h;
        }
        if (model_.copy_engines > 0) queued = queued || ++ls->per_source[pair_src_[p]] > model_.copy_engines;
      }
      if (model_.copy_engines > 0)
        for (int p : dec.pairs[i]) ls->per_source[pair_src_[p]] = 0;
      if (signature) sig = mix64(sig ^ group);
      *exact = *exact && !(queued && sharing_costs);
      total += latency_s_ + worst;
      if (group_bounds) group_bounds->push_back(latency_s_ + worst);
    }
    if (signature) *signature = sig;
    return total;
  }
  const bool stoppable = hot && hot->link >= 0 && (stop < std::numeric_limits<double>::infinity() ||
                                                   stop_inexact < std::numeric_limits<double>::infinity());
  double hot_left = stoppable ? hot->load : 0.0;  // bytes on the hot link in the groups to come
  const bool all_links = stoppable && hot->loads && hot->loads->size() == link_bw_.size();
  if (all_links) ls->left_load.assign(hot->loads->begin(), hot->loads->end());  // every link's bytes to come
  // With an early stop the groups are bounded last first: the hot pairs, placed first, are then
  // in the groups to come, where the hot link's drain bounds them closely.  Their bounds are
  // summed in plan order at the end (the same total).
  const size_t groups = (dec.pairs.size() + merge - 1) / merge;
  const bool backwards = stoppable && !signature && !group_bounds;
  if (backwards) ls->group_bound.assign(groups, 0.0);
  // The busiest link's bytes to come take a scan of every link: done every `scan_every` groups,
  // so that the scans cost about an eighth of adding the transfers (about 6 links each).
  size_t scan_every = 1;
  if (all_links) {
    size_t transfers = 0;
    for (const auto& ph : dec.pairs) transfers += ph.size();
    scan_every = std::max<size_t>(1, (8 * link_bw_.size() * groups) / std::max<size_t>(1, 6 * transfers));
  }
  double done = 0.0;  // bounds of the groups done so far
  // The group's flows and touched links in flat buffers written by index (no push_back per
  // transfer); the link tables through local pointers.
  if (ls->mb_pair.size() < pair_links_.size()) {
    ls->mb_pair.resize(pair_links_.size());
    ls->mb_bytes.resize(pair_links_.size());
  }
  if (ls->mb_touched.size() < link_bw_.size()) ls->mb_touched.resize(link_bw_.size());
  // Under contention each link's flow sizes are also written to its kOnLink slots as the
  // transfers are added (a repeated pair adds to its slot: paths of at most 8 links), so the
  // shared links' sizes need no second pass over the flows unless a link has more flows.
  const bool keep_sizes = model_.eta_beta > 0.0 && (dec.unique || !pair_path8_.empty());
  if (ls->on_link.size() < link_bw_.size() * kOnLink) ls->on_link.resize(link_bw_.size() * kOnLink);  // written by unique decompositions always
  if (keep_sizes && !dec.unique && ls->flow_rank.size() < pair_links_.size() * 8) ls->flow_rank.resize(pair_links_.size() * 8);
  double* const onl = ls->on_link.data();
  int* const frank = ls->flow_rank.data();
  int* const fp = ls->mb_pair.data();
  double* const fb = ls->mb_bytes.data();
  int* const tl = ls->mb_touched.data();
  double* const load = ls->load.data();
  int* const flows = ls->flows.data();
  int* const slot = ls->slot.data();
  const double* const ibw = inv_bw_.data();
  const double* const bw = link_bw_.data();
  const size_t nlinks = link_bw_.size();
  for (size_t g = 0; g < groups; ++g) {
    const size_t start = (backwards ? groups - 1 - g : g) * static_cast<size_t>(merge);
    const size_t end = std::min(dec.pairs.size(), start + static_cast<size_t>(merge));
    int nf = 0, nt = 0;
    bool spilled = !keep_sizes;  // some link has more than kOnLink flows
    for (size_t i = start; i < end; ++i) {
      const int* const pi = dec.pairs[i].data();
      const int64_t* const bi = dec.bytes[i].data();
      const size_t count = dec.pairs[i].size();
      for (size_t k = 0; k < count; ++k) {
        const int p = pi[k];
        const double b = static_cast<double>(bi[k]);
        const int* const lb = pl_.data() + pl_off_[p];
        const int* const le = pl_.data() + pl_off_[p + 1];
        if (dec.unique) {  // every pair appears once in the decomposition: a new flow
          fp[nf] = p;
          fb[nf] = b;
          ++nf;
          for (const int* it = lb; it != le; ++it) {
            const int l = *it;
            load[l] += b;
            const int r = flows[l]++;
            if (r == 0) tl[nt++] = l;
            if (r < kOnLink)
              onl[l * kOnLink + r] = b;
            else
              spilled = true;
          }
          continue;
        }
        // A pair repeated inside the group is one flow (as materialize() merges it).
        int& at = slot[p];
        if (at < 0) {
          at = nf;
          fp[nf] = p;
          fb[nf] = b;
          ++nf;
          int* const rk = frank + static_cast<size_t>(at) * 8;
          for (const int* it = lb; it != le; ++it) {
            const int l = *it;
            load[l] += b;
            const int r = flows[l]++;
            if (r == 0) tl[nt++] = l;
            if (!keep_sizes) continue;
            rk[it - lb] = r;
            if (r < kOnLink)
              onl[l * kOnLink + r] = b;
            else
              spilled = true;
          }
        } else {
          fb[at] += b;
          const int* const rk = frank + static_cast<size_t>(at) * 8;
          for (const int* it = lb; it != le; ++it) {
            const int l = *it;
            load[l] += b;
            if (keep_sizes && rk[it - lb] < kOnLink) onl[l * kOnLink + rk[it - lb]] += b;
          }
        }
      }
    }
    // The busiest link's plain time: screened with reciprocals, then the exact division for the
    // links within kScreen of the screened maximum (the same value as dividing every link).
    // When the group touches a good share of the links, the per-link loops run over all of them
    // in index order (untouched links hold zeros): no gather through the touched list.
    const bool dense = static_cast<size_t>(nt) * kDenseShare >= nlinks;
    double wu = 0.0;
    bool shared = false;
    if (dense) {
      double m0 = 0.0, m1 = 0.0;
      int most = 0;
      size_t l = 0;
      for (; l + 2 <= nlinks; l += 2) {
        m0 = std::max(m0, load[l] * ibw[l]);
        m1 = std::max(m1, load[l + 1] * ibw[l + 1]);
        most = std::max(most, std::max(flows[l], flows[l + 1]));
      }
      for (; l < nlinks; ++l) {
        m0 = std::max(m0, load[l] * ibw[l]);
        most = std::max(most, flows[l]);
      }
      wu = std::max(m0, m1);
      shared = most > 1;
    } else {
      for (int j = 0; j < nt; ++j) {
        const int l = tl[j];
        shared = shared || flows[l] > 1;
        wu = std::max(wu, load[l] * ibw[l]);
      }
    }
    double worst = 0.0;
    const double cut = wu * (1.0 - kScreen);
    // Dense groups under contention with eta at its floor past the table: the same scan also
    // lists the shared links whose upper end reaches cut x (1 - kScreen), a superset of those
    // the needed-link test below can take (its threshold is worst x (1 - kScreen), worst being
    // wu within a few ulps), so that test runs over this list instead of every link.
    const bool list_near = dense && eta_floored_ && model_.eta_beta > 0.0;
    if (list_near) {
      const double* const ie = inv_eta_table_.data();
      const int last = static_cast<int>(inv_eta_table_.size()) - 1;
      const double lower = cut * (1.0 - kScreen);
      std::vector<int>& nt_list = ls->near_top;
      nt_list.clear();
      for (size_t l = 0; l < nlinks; ++l) {
        const double m = load[l] * ibw[l];
        if (m >= cut) worst = std::max(worst, load[l] / bw[l]);
        const int k = flows[l];
        if ((k > 1) & (m * ie[std::min(k, last)] >= lower)) nt_list.push_back(static_cast<int>(l));
      }
    } else if (dense) {
      for (size_t l = 0; l < nlinks; ++l)
        if (load[l] * ibw[l] >= cut) worst = std::max(worst, load[l] / bw[l]);
    } else {
      for (int j = 0; j < nt; ++j) {
        const int l = tl[j];
        if (load[l] * ibw[l] >= cut) worst = std::max(worst, load[l] / bw[l]);
      }
    }
    // Signature of the fused phases as the cost model sees them: the flows and their bytes,
    // in order when copy-engine queues make the order matter.
    if (signature) {
      uint64_t group = 0;
      for (int f = 0; f < nf; ++f) {
        const uint64_t h = mix64((static_cast<uint64_t>(fp[f]) << 40) ^ static_cast<uint64_t>(fb[f]));
        group = model_.copy_engines > 0 ? mix64(group ^ h) : group + h;
      }
      sig = mix64(sig ^ group);
    }
    if (shared && model_.eta_beta > 0.0) {
      // A shared link drains in at least load / bw and at most load / (bw * eta(k)); only the
      // links whose upper end passes the busiest plain time can decide the maximum, so only
      // their flow sizes are gathered and sorted.
      // (The test is screened with multiplications by reciprocals; only values within kScreen
      // of the threshold take the exact division.)  The sizes go into one buffer, each needed
      // link's segment as long as its flow count.
      std::vector<int>& needed = ls->needed;
      std::vector<double>& needed_u = ls->needed_u;
      needed.clear();
      needed_u.clear();
      int total_flows = 0;
      const double over = worst * (1.0 + kScreen), near = worst * (1.0 - kScreen);
      size_t top = 0;  // the needed link with the largest upper end: drained first
      auto consider = [&](int l, int k) {
        const double u = load[l] * ibw[l] * inv_eta(k);
        if (!(u > over || (u >= near && load[l] / (bw[l] * eta(k)) > worst))) return;
        ls->need[l] = 1;
        ls->bucket_at[l] = total_flows;
        total_flows += k;
        if (!needed.empty() && u > needed_u[top]) top = needed.size();
        needed.push_back(l);
        needed_u.push_back(u);
      };
      if (list_near) {
        // The listed links in index order (the dense scan's order): the upper end through the eta
        // table clamped at its last entry (every larger count is at the floor too, so the value
        // is consider()'s own), then consider().
        const double* const ie = inv_eta_table_.data();
        const int last = static_cast<int>(inv_eta_table_.size()) - 1;
        for (int l : ls->near_top) {
          const int k = flows[l];
          const double u = load[l] * ibw[l] * ie[std::min(k, last)];
          if (u >= near) consider(l, k);
        }
      } else if (dense) {
        for (size_t l = 0; l < nlinks; ++l)
          if (flows[l] > 1) consider(static_cast<int>(l), flows[l]);
      } else {
        for (int j = 0; j < nt; ++j)
          if (flows[tl[j]] > 1) consider(tl[j], flows[tl[j]]);
      }
      // A link's drain is at most its upper end (a few ulps: u carries a 1e-6 margin), so once
      // the largest upper end's link is drained the links whose upper end stays under the
      // maximum found cannot change it and are skipped (the same maximum).
      if (!needed.empty()) {
        std::swap(needed[0], needed[top]);
        std::swap(needed_u[0], needed_u[top]);
      }
      // Drains needed link j from its k flow sizes at sz (sorted by `sort`, smallest first: the
      // i-th from the end is delivered while k - i flows share the link), unless its upper end
      // cannot raise `worst`.
      auto drain = [&](size_t j, double* sz, auto sort) {
        const int l = needed[j];
        ls->need[l] = 0;
        if (needed_u[j] * (1.0 + 1e-6) < worst) return;
        const int k = flows[l];
        sort(sz, k);
        double t = 0.0;
        for (int i = 0; i < k; ++i) t += sz[i] / (bw[l] * eta(k - i));
        worst = std::max(worst, t);
      };
      if (!needed.empty() && !spilled) {
        auto insertion_sort = [](double* sz, int k) {  // at most kOnLink sizes
          for (int i = 1; i < k; ++i) {
            const double x = sz[i];
            int j = i;
            for (; j > 0 && sz[j - 1] > x; --j) sz[j] = sz[j - 1];
            sz[j] = x;
          }
        };
        for (size_t j = 0; j < needed.size(); ++j) drain(j, onl + needed[j] * kOnLink, insertion_sort);
      } else if (!needed.empty()) {
        // Every flow writes its size at each of its links' next slot; the links not needed all
        // point at one spare slot (bucket[0]) and do not advance (no branch per link).
        ls->bucket.resize(static_cast<size_t>(total_flows) + 1);
        double* buf = ls->bucket.data() + 1;
        const char* const nd = ls->need.data();
        int* const at = ls->bucket_at.data();
        for (int j = 0; j < nt; ++j)
          if (!nd[tl[j]]) at[tl[j]] = -1;
        for (int f = 0; f < nf; ++f) {
          const int p = fp[f];
          const double x = fb[f];
          for (const int* it = pl_.data() + pl_off_[p], *e = pl_.data() + pl_off_[p + 1]; it != e; ++it) {
            const int l = *it;
            buf[at[l]] = x;
            at[l] += nd[l];
          }
        }
        for (size_t j = 0; j < needed.size(); ++j)
          drain(j, buf + (at[needed[j]] - flows[needed[j]]), [](double* sz, int k) { std::sort(sz, sz + k); });
      }
    }
    if (model_.copy_engines > 0 && !shared) {
      for (int f = 0; f < nf; ++f) shared = shared || ++ls->per_source[pair_src_[fp[f]]] > model_.copy_engines;
      for (int f = 0; f < nf; ++f) ls->per_source[pair_src_[fp[f]]] = 0;
    }
    *exact = *exact && !(shared && sharing_costs);
    if (stoppable) hot_left -= load[hot->link];
    double* const left_load = all_links ? ls->left_load.data() : nullptr;
    if (dense) {
      if (left_load)
        for (size_t l = 0; l < nlinks; ++l) left_load[l] -= load[l];
      std::fill(load, load + nlinks, 0.0);
      std::fill(flows, flows + nlinks, 0);
    } else {
      for (int j = 0; j < nt; ++j) {
        const int l = tl[j];
        if (left_load) left_load[l] -= load[l];
        load[l] = 0.0;
        flows[l] = 0;
      }
    }
    if (!dec.unique)
      for (int f = 0; f < nf; ++f) slot[fp[f]] = -1;
    if (backwards)
      ls->group_bound[start / merge] = latency_s_ + worst;
    else
      total += latency_s_ + worst;
    done += latency_s_ + worst;
    if (group_bounds) group_bounds->push_back(latency_s_ + worst);
    if (stoppable && g + 1 < groups) {
      // The hot link's bytes left, drained as in floor_at(): in each group its t-th largest flow
      // moves at bandwidth * eta(t) at most, and rank t holds at most groups x biggest bytes.
      const double groups_left = static_cast<double>(groups - g - 1);
      double left = std::max(hot_left, 0.0) * (1.0 - 1e-9), rest = groups_left * latency_s_;
      for (int rank = 1; left > 0.0; ++rank) {
        const double take = std::min(left, groups_left * hot->biggest);
        rest += take / (hot->bw * eta(rank));
        left -= take;
      }
      const double limit = *exact ? stop : std::min(stop, stop_inexact);
      if (floor_prefix && done + rest <= limit) {
        // The groups to come's floors (the most loaded links' bytes in each, see peer_floor_prefix()).
        const std::vector<double>& fp_sum = *floor_prefix;
        const double floors = backwards ? fp_sum[groups - g - 1] : fp_sum[groups] - fp_sum[g + 1];
        rest = std::max(rest, floors * (1.0 - 1e-9));
      }
      if (done + rest <= limit && all_links && (g + 1) % scan_every == 0) {
        // Else the busiest link's bytes to come.
        double busiest = 0.0;
        for (size_t l = 0; l < link_bw_.size(); ++l) busiest = std::max(busiest, ls->left_load[l] * inv_bw_[l]);
        rest = std::max(rest, groups_left * latency_s_ + busiest * (1.0 - 1e-9));
      }
      if (done + rest > limit) {
        *exact = false;
        if (signature) *signature = 0;
        return std::numeric_limits<double>::infinity();
      }
    }
  }
  if (backwards)
    for (double b : ls->group_bound) total += b;
  if (signature) *signature = sig;
  return total;
}

// The peer-round decomposition's bytes per round on the links loaded to at least a quarter of
// the busiest link's time (at most kPeerFloorLinks of them, the most loaded), from the
// topology's link -> pairs index (link-major: each link's rounds are adjacent).
void Scheduler::peer_loads(const std::vector<int64_t>& demand, const Decomposition& dec,
                           const std::vector<double>& load, double bound_s, PeerLoads* out) const {
  out->links.clear();
  std::vector<std::pair<double, int>> hot;
  for (size_t l = 0; l < load.size(); ++l) {
    const double busy = load[l] / link_bw_[l];
    if (busy > 0.0 && busy >= 0.25 * bound_s) hot.push_back({-busy, static_cast<int>(l)});
  }
  if (hot.size() > static_cast<size_t>(kPeerFloorLinks)) {
    std::nth_element(hot.begin(), hot.begin() + kPeerFloorLinks, hot.end());
    hot.resize(kPeerFloorLinks);
  }
  for (const auto& h : hot) out->links.push_back(h.second);
  // Round k (destination - source mod n) -> phase index (rounds without demand have none).
  std::vector<int> phase_of(static_cast<size_t>(n_), -1);
  for (size_t i = 0; i < dec.pairs.size(); ++i) {
    const int p = dec.pairs[i].front();
    const int k = pair_dst_[p] - pair_src_[p];
    phase_of[k < 0 ? k + n_ : k] = static_cast<int>(i);
  }
  const size_t P = dec.pairs.size(), K = out->links.size();
  out->phases = P;
  out->bytes.assign(K * P, 0.0);
  for (size_t c = 0; c < K; ++c) {
    const int l = out->links[c];
    double* const by = out->bytes.data() + c * P;
    for (int k = lp_off_[l]; k < lp_off_[l + 1]; ++k) {
      const int p = lp_[k];
      if (demand[p] <= 0 || pair_src_[p] == pair_dst_[p]) continue;
      const int r = pair_dst_[p] - pair_src_[p];
      by[phase_of[r < 0 ? r + n_ : r]] += static_cast<double>(demand[p]);
    }
  }
}

// An upper bound on the unfused peer-round bound: per round, its start latency plus, over the
// links, flows / (bandwidth x eta(flows)) times the round's largest transfer (a link's
// smallest-first drain is at most its bytes / (bandwidth x eta(flows)), and a link carries at
// most round_flows_ pairs of one round), summed over the rounds.
double Scheduler::peer_upper_simple(const Decomposition& dec) const {
  double f = 0.0;  // max over links of flows / (bandwidth x eta(flows))
  for (size_t l = 0; l < round_flows_.size(); ++l)
    if (round_flows_[l] > 0) f = std::max(f, round_flows_[l] * inv_bw_[l] * inv_eta(round_flows_[l]));
  double total = 0.0;
  for (const auto& b : dec.bytes) {
    int64_t most = 0;
    for (int64_t x : b) most = std::max(most, x);
    total += latency_s_ + static_cast<double>(most) * f;
  }
  return total;
}

// A tighter upper bound on the unfused peer-round bound than peer_upper_simple(), at the cost of
// one walk over the rounds' transfers: per round, its start latency plus the most, over the
// links, of the round's bytes on the link / (bandwidth x eta(round_flows_)) (a link's
// smallest-first drain is at most its bytes / (bandwidth x eta(its flows)), eta does not grow
// with the flows, and a round puts at most round_flows_ pairs on a link).  Uses ls->load
// (zeros on entry and on return).
double Scheduler::peer_upper_rounds(const Decomposition& dec, LinkScratch* ls) const {
  const size_t L = link_bw_.size();
  std::vector<double> w(L);
  for (size_t l = 0; l < L; ++l) w[l] = round_flows_[l] > 0 ? inv_bw_[l] * inv_eta(round_flows_[l]) : 0.0;
  const double* const wl = w.data();
  double* const load = ls->load.data();
  const int* const pl = pl_.data();
  const int* const off = pl_off_.data();
  double total = 0.0;
  for (size_t i = 0; i < dec.pairs.size(); ++i) {
    const int* const pi = dec.pairs[i].data();
    const int64_t* const bi = dec.bytes[i].data();
    const size_t count = dec.pairs[i].size();
    for (size_t k = 0; k < count; ++k) {
      const double b = static_cast<double>(bi[k]);
      for (int j = off[pi[k]], e = off[pi[k] + 1]; j < e; ++j) load[pl[j]] += b;
    }
    double m0 = 0.0, m1 = 0.0;
    size_t l = 0;
    for (; l + 2 <= L; l += 2) {
      m0 = std::max(m0, load[l] * wl[l]);
      m1 = std::max(m1, load[l + 1] * wl[l + 1]);
    }
    for (; l < L; ++l) m0 = std::max(m0, load[l] * wl[l]);
    std::fill(load, load + L, 0.0);
    total += latency_s_ + std::max(m0, m1);
  }
  return total;
}

// Prefix sums of per-group floors of the peer rounds fused by `merge`: a group's bound is at least
// its start latency plus, for each kept link, the group's bytes on it over its bandwidth (the
// same division as in merged_bound(); byte sums are exact integers).
void Scheduler::peer_floor_prefix(const PeerLoads& pl, size_t phases, int merge, std::vector<double>* prefix) const {
  const size_t K = pl.links.size(), P = pl.phases;
  const size_t groups = (phases + merge - 1) / merge;
  std::vector<double> worst(groups, 0.0);
  for (size_t c = 0; c < K; ++c) {
    const double* const by = pl.bytes.data() + c * P;
    const double bw = link_bw_[pl.links[c]];
    for (size_t g = 0; g < groups; ++g) {
      double sum = 0.0;
      for (size_t i = g * merge; i < std::min(phases, (g + 1) * static_cast<size_t>(merge)); ++i) sum += by[i];
      worst[g] = std::max(worst[g], sum / bw);
    }
  }
  prefix->assign(groups + 1, 0.0);
  for (size_t g = 0; g < groups; ++g) (*prefix)[g + 1] = (*prefix)[g] + latency_s_ + worst[g];
}

// Peer rounds as a decomposition: round k pairs s with (s + k) mod n (NCCL's pairwise
// exchange).  Fused, its order is round-major, which spreads each source's first transfers
// over distinct receivers.
Scheduler::Decomposition Scheduler::peer_decomposition(const std::vector<int64_t>& demand) const {
  Decomposition dec;
  dec.family = kPeerRounds;
  dec.unique = true;
  dec.pairs.reserve(static_cast<size_t>(n_));
  dec.bytes.reserve(static_cast<size_t>(n_));
  for (int k = 1; k < n_; ++k) {
    std::vector<int> pairs;
    std::vector<int64_t> amount;
    pairs.reserve(static_cast<size_t>(n_));
    amount.reserve(static_cast<size_t>(n_));
    for (int s = 0; s < n_; ++s) {
      const int p = s * n_ + (s + k < n_ ? s + k : s + k - n_);
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

// Peer rounds packed into link-disjoint phases: pairs in round order (s -> s+k for k = 1, 2, ...),
// the pairs crossing a link loaded to at least kHotShare of the busiest link first, each placed
// whole in the first phase where all its links are still free (first fit; a bit set of phases
// per link).  Every phase carries at most one transfer per link, so its cost is exact, like a
// link-greedy phase, but building it costs one pass over the pairs, where link-greedy scans
// them once per phase.  Cooler pairs then fill the links the hot ones leave idle.
// Sliced (under contention, bandwidth-bound sizes: see kSliceLatencyShare): the first transfer
// placed in a phase sets its span (its time at its pair rate); a later pair sends what fits in that span (a remainder within kWholeSlack
// goes whole) and its remainder goes on to the next phase where its links are free, as
// link-greedy's slices do: unfused, no phase waits on a long cold pair (64 ranks, 256 MB:
// MoE 1.23x -> 0.97x the best baseline, hot experts 1.72x -> 0.98x; uniform unchanged).
Scheduler::Decomposition Scheduler::split_peer_decomposition(const std::vector<int64_t>& demand,
                                                             const std::vector<double>& weight, bool sliced) const {
  Decomposition dec;
  dec.family = kSplitPeer;
  dec.unique = true;
  dec.disjoint = true;
  std::vector<int> order;  // placement order: hot pairs, then the others, each in round order
  std::vector<int> cold;
  order.reserve(demand.size());
  cold.reserve(demand.size());
  const double hot_weight = kMinWeight + kHotShare;
  for (int k = 1; k < n_; ++k)
    for (int s = 0, d = k; s < n_; ++s, d = d + 1 == n_ ? 0 : d + 1) {
      const int p = s * n_ + d;
      if (demand[p] > 0) (weight[p] >= hot_weight ? order : cold).push_back(p);
    }
  order.insert(order.end(), cold.begin(), cold.end());
  const size_t links = link_bw_.size();
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
    const int* const lb = pl_.data() + pl_off_[p];
    const int* const le = pl_.data() + pl_off_[p + 1];
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
        dec.pairs.back().reserve(static_cast<size_t>(n_));
        dec.bytes.back().reserve(static_cast<size_t>(n_));
        span.push_back(0.0);
      }
      int64_t take = left;
      if (sliced) {
        if (span[j] <= 0.0) {
          span[j] = static_cast<double>(left) / pair_rate_[p];
        } else {
          const double fit = span[j] * pair_rate_[p];
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

// All pairs in one phase in source-major order (what `direct` issues).
Scheduler::Decomposition Scheduler::direct_decomposition(const std::vector<int64_t>& demand) const {
  Decomposition dec;
  dec.family = kDirect;
  dec.unique = true;
  dec.pairs.emplace_back();
  dec.bytes.emplace_back();
  dec.pairs.back().reserve(demand.size());
  dec.bytes.back().reserve(demand.size());
  for (size_t p = 0; p < demand.size(); ++p)
    if (pair_src_[p] != pair_dst_[p] && demand[p] > 0) {
      dec.pairs.back().push_back(static_cast<int>(p));
      dec.bytes.back().push_back(demand[p]);
    }
  return dec;
}

// Quanta: whole pairs per phase (few phases), or slices of the bottleneck time so that the
// bottleneck link stays busy in every phase even when a few pairs dominate (skew).
// Past kMaxSimulatedRanks ranks only the slice is planned (each pass costs phases x pairs).
std::vector<int64_t> Scheduler::quanta(int64_t top, double bound_s) const {
  const int64_t slice = static_cast<int64_t>(std::ceil(bound_s * rate_Bps_ / n_));
  const bool sliced = slice > 0 && slice < top;
  if (sliced && n_ > kMaxSimulatedRanks) return {slice};
  return sliced ? std::vector<int64_t>{top, slice} : std::vector<int64_t>{top};
}

// Quanta of the link-greedy passes: with the largest demand as quantum a slow lead
// (cross-socket) still gets a rate-scaled slice; one more pass (quantum above the largest
// demand) lets it go whole, which keeps uniform cross-socket pairs in one piece.
std::vector<int64_t> Scheduler::link_passes(const std::vector<int64_t>& qs, int64_t top) const {
  std::vector<int64_t> passes = qs;
  if (n_ <= kMaxSimulatedRanks && qs.front() == top) passes.insert(passes.begin(), top + 1);
  return passes;
}

Scheduler::Decomposition Scheduler::link_decomposition(const std::vector<int64_t>& demand, int64_t quantum,
                                                       int64_t top) const {
  Decomposition dec;
  dec.pairs = link_greedy(demand, quantum, &dec.bytes);
  dec.quantum = std::min(quantum, top);
  dec.family = kLinkGreedy;
  dec.disjoint = true;
  return dec;
}

// Backfill: moves whole transfers of the shortest phases into longer phases that provably still
// end when their longest transfer alone would, and drops the phases it empties.  Why it is safe:
// under max-min sharing a flow has the largest rate on its bottleneck link, so its rate is at
// least the equal share bw * eta(k) / k of the most crowded link on its path, and that share only
// grows as flows finish.  So if on every link of a phase each flow's bytes are at most
// T * bw * eta(k) / k, T being the phase's longest transfer alone, every flow ends by T and the
// phase lasts exactly T: the cost merged_bound() charges a disjoint phase.  Link-greedy leaves
// tails of short phases (cold pairs whose links the hot pairs held in every long phase: gen5 x4
// Zipf 1.6 1 GB, 54 phases, 2 % of the plan); moved into the long phases' idle links they stop
// paying a start latency each.  Not with copy-engine queues (a source's extra transfer waits).
// Returns whether anything moved.
bool Scheduler::backfill(Decomposition* dec) const {
  const size_t phases = dec->pairs.size();
  if (phases < 2 || model_.copy_engines > 0) return false;
  const size_t links = link_bw_.size();
  const size_t words = (pair_links_.size() + 63) / 64;
  std::vector<double> span(phases, 0.0);            // each phase's longest transfer alone
  std::vector<int> flows(phases * links, 0);        // phase-major: flows on each link
  std::vector<double> biggest(phases * links, 0.0); // and the largest of their bytes
  std::vector<uint64_t> member(phases * words, 0);  // pairs in each phase
  // Tentative moves of the phase being emptied: (phase * links + link, its biggest before).
  std::vector<std::pair<size_t, double>> undo;
  auto add = [&](size_t i, int p, double b, bool logged) {
    member[i * words + p / 64] |= uint64_t{1} << (p % 64);
    for (int l : links_of(p)) {
      const size_t at = i * links + static_cast<size_t>(l);
      if (logged) undo.emplace_back(at, biggest[at]);
      flows[at] += 1;
      biggest[at] = std::max(biggest[at], b);
    }
  };
  for (size_t i = 0; i < phases; ++i)
    for (size_t k = 0; k < dec->pairs[i].size(); ++k) {
      const int p = dec->pairs[i][k];
      const double b = static_cast<double>(dec->bytes[i][k]);
      span[i] = std::max(span[i], b / pair_min_bw_[p]);
      add(i, p, b, false);
    }
  std::vector<int> longest(phases);  // destinations, longest first (ties: plan order)
  for (size_t i = 0; i < phases; ++i) longest[i] = static_cast<int>(i);
  std::stable_sort(longest.begin(), longest.end(), [&](int a, int b) { return span[a] > span[b]; });
  // A transfer fits in phase d when every link of its path keeps each flow within the share.
  double work = kBackfillWork;
  auto fits = [&](int d, int p, double b) {
    for (int l : links_of(p)) {
      work -= 1.0;
      const int k = flows[d * links + l] + 1;
      if (std::max(biggest[d * links + l], b) > span[d] * link_bw_[l] * eta(k) / k) return false;
    }
    return true;
  };
  // Shortest phases first, each emptied whole or left as it was (a phase that kept some
  // transfers must keep its span: the flows moved into it were checked against that span).  A
  // phase is only ever a destination of shorter ones, so an emptied phase's tables need no
  // update.
  std::vector<int> dest_of;
  std::vector<int> emptied;
  for (auto q = longest.rbegin(); q != longest.rend() && work > 0.0; ++q) {
    const std::vector<int>& qp = dec->pairs[*q];
    const std::vector<int64_t>& qb = dec->bytes[*q];
    undo.clear();
    dest_of.assign(qp.size(), -1);
    bool all = true;
    for (size_t k = 0; k < qp.size() && all; ++k) {
      const int p = qp[k];
      const double b = static_cast<double>(qb[k]);
      for (int d : longest) {
        if (span[d] <= span[*q] || b > span[d] * pair_min_bw_[p] || work <= 0.0) break;
        if (member[d * words + p / 64] & (uint64_t{1} << (p % 64))) continue;  // one flow per pair
        if (fits(d, p, b)) {
          dest_of[k] = d;
          add(static_cast<size_t>(d), p, b, true);
          break;
        }
      }
      all = dest_of[k] >= 0;
    }
    if (!all) {  // roll the tentative moves back
      for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
        flows[it->first] -= 1;
        biggest[it->first] = it->second;
      }
      for (size_t k = 0; k < qp.size(); ++k)
        if (dest_of[k] >= 0) member[dest_of[k] * words + qp[k] / 64] &= ~(uint64_t{1} << (qp[k] % 64));
      continue;
    }
    for (size_t k = 0; k < qp.size(); ++k) {
      dec->pairs[dest_of[k]].push_back(qp[k]);
      dec->bytes[dest_of[k]].push_back(qb[k]);
    }
    emptied.push_back(*q);
  }
  if (emptied.empty()) return false;
  for (int q : emptied) {
    dec->pairs[q].clear();
    dec->bytes[q].clear();
  }
  size_t out = 0;
  for (size_t i = 0; i < phases; ++i)
    if (!dec->pairs[i].empty()) {
      if (out != i) {
        dec->pairs[out] = std::move(dec->pairs[i]);
        dec->bytes[out] = std::move(dec->bytes[i]);
      }
      ++out;
    }
  dec->pairs.resize(out);
  dec->bytes.resize(out);
  return true;
}

void Scheduler::other_decompositions(const std::vector<int64_t>& demand, const std::vector<double>& weight,
                                     int64_t top, bool with_catalog, std::vector<Decomposition>* out) const {
  // The catalog pass scores every working-set channel per phase, the largest planning cost on
  // few ranks: it runs only when the link-greedy plan leaves room (with_catalog), and not past
  // kCatalogMaxRanks ranks, where it costs more planning time than its plans save.
  const bool only_catalog = candidates_ == kCatalogChannels;
  if ((candidates_ & kCatalogChannels) && ((with_catalog && n_ <= kCatalogMaxRanks) || only_catalog)) {
    out->emplace_back();
    out->back().pairs = decompose(demand, weight, top, false, &out->back().bytes);
    out->back().quantum = top;
    out->back().family = kCatalogChannels;
  }
  if (candidates_ & kPeerRounds) out->push_back(peer_decomposition(demand));
  // Source-major order starts every source on the same few receivers; with copy-engine queues
  // that serialises the whole exchange.  Below kMaxSimulatedRanks the event model sees it and
  // rejects it where needed; past it (bounds only) the candidate is not offered.
  const bool queued_blind = model_.copy_engines > 0 && n_ > kMaxSimulatedRanks;
  if ((candidates_ & kDirect) && (!queued_blind || candidates_ == kDirect)) out->push_back(direct_decomposition(demand));
}

// A time-sharing plan: one phase per configuration used (longest first), each pair's bytes
// split over its phases in proportion to time x rate and scaled to its demand (the LP covers it,
// possibly with some to spare), rounding remainders in the pair's largest piece.  ids: the pair
// id of each member index.
Scheduler::Decomposition Scheduler::time_share_plan(const std::vector<int>& ids, const std::vector<int64_t>& demand,
                                                    const std::vector<TimeShareColumn>& used) const {
  Decomposition dec;
  dec.family = kTimeShare;
  std::vector<double> covered(ids.size(), 0.0);
  for (const auto& c : used)
    for (size_t j = 0; j < c.members.size(); ++j) covered[c.members[j]] += c.seconds * c.rates[j];
  std::vector<int64_t> left(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) left[i] = demand[ids[i]];
  std::vector<int> largest(ids.size(), -1);  // phase of each pair's largest piece
  std::vector<int64_t> largest_bytes(ids.size(), 0);
  for (const auto& c : used) {
    std::vector<int> pairs;
    std::vector<int64_t> bytes;
    for (size_t j = 0; j < c.members.size(); ++j) {
      const int i = c.members[j];
      if (covered[i] <= 0.0) continue;
      const double share = c.seconds * c.rates[j] / covered[i];
      const int64_t b = std::min(left[i], static_cast<int64_t>(std::floor(share * static_cast<double>(demand[ids[i]]))));
      if (b <= 0) continue;
      left[i] -= b;
      if (b > largest_bytes[i]) {
        largest_bytes[i] = b;
        largest[i] = static_cast<int>(dec.pairs.size());
      }
      pairs.push_back(ids[i]);
      bytes.push_back(b);
    }
    if (pairs.empty()) continue;
    dec.pairs.push_back(std::move(pairs));
    dec.bytes.push_back(std::move(bytes));
  }
  std::vector<int> rest;
  std::vector<int64_t> rest_bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (left[i] <= 0) continue;
    if (largest[i] < 0) {  // every piece rounded down to 0 bytes (a tiny demand): in a last phase
      rest.push_back(ids[i]);
      rest_bytes.push_back(left[i]);
      continue;
    }
    auto& ph = dec.pairs[largest[i]];
    const size_t at = static_cast<size_t>(std::find(ph.begin(), ph.end(), ids[i]) - ph.begin());
    dec.bytes[largest[i]][at] += left[i];
  }
  if (!rest.empty()) {
    dec.pairs.push_back(std::move(rest));
    dec.bytes.push_back(std::move(rest_bytes));
  }
  return dec;
}

// Up to 4 GPUs: the exact optimum over the tabled configurations.
Scheduler::Decomposition Scheduler::time_share_decomposition(const std::vector<int64_t>& demand) const {
  const std::vector<int>& ids = timeshare_->pairs();
  std::vector<double> want(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) want[i] = static_cast<double>(demand[ids[i]]);
  std::vector<TimeShareColumn> used;
  for (const auto& [mask, secs] : timeshare_->solve(want)) {
    TimeShareColumn c;
    for (size_t i = 0; i < ids.size(); ++i)
      if ((mask >> i) & 1u) {
        c.members.push_back(static_cast<int>(i));
        c.rates.push_back(timeshare_->rate(mask, static_cast<int>(i)));
      }
    c.seconds = secs;
    used.push_back(std::move(c));
  }
  return time_share_plan(ids, demand, used);
}

// Past 4 GPUs: column generation (time_share_search()) over the demanded pairs, started from
// the phases of `start` (the first link-greedy decomposition).
Scheduler::Decomposition Scheduler::time_share_search_decomposition(const std::vector<int64_t>& demand,
                                                                    const Decomposition& start, int rounds) const {
  std::vector<int> ids, index_of(demand.size(), -1);
  std::vector<std::vector<int>> links;
  std::vector<double> want;
  for (size_t p = 0; p < demand.size(); ++p) {
    if (pair_src_[p] == pair_dst_[p] || demand[p] <= 0) continue;
    index_of[p] = static_cast<int>(ids.size());
    ids.push_back(static_cast<int>(p));
    links.push_back(pair_links_[p]);
    want.push_back(static_cast<double>(demand[p]));
  }
  std::vector<std::vector<int>> phases;
  for (const auto& ph : start.pairs) {
    std::vector<int> set;
    for (int p : ph) set.push_back(index_of[p]);
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
    phases.push_back(std::move(set));
  }
  return time_share_plan(ids, demand,
                         time_share_search(links, link_bw_, eta_upto(static_cast<int>(ids.size())), want, phases, rounds));
}

// Host rounds: one phase; source s queues its transfers to the other hosts first by host offset
// (host(s) + 1, + 2, ...), within a host by local-index offset (so the sources of one host start
// on different GPUs of the target host), with its same-host transfers (by local-index offset)
// spread evenly among them (Bresenham: one after every R / L remote ones).  With copy-engine
// queues this keeps every source on one remote and one local transfer most of the time, and the
// hosts' NIC pairs evenly loaded.
Scheduler::Decomposition Scheduler::host_rounds_decomposition(const std::vector<int64_t>& demand) const {
  Decomposition dec;
  dec.family = kHostRounds;
  dec.unique = true;
  std::vector<int> phase;
  std::vector<int64_t> bytes;
  std::vector<std::pair<int64_t, int>> remote, local;  // (sort key, destination)
  for (int s = 0; s < n_; ++s) {
    remote.clear();
    local.clear();
    const int hs = host_of_[s];
    for (int d = 0; d < n_; ++d) {
      if (d == s || demand[static_cast<size_t>(s) * n_ + d] <= 0) continue;
      const int hd = host_of_[d];
      const int64_t within = (local_index_[d] - local_index_[s] + 2 * host_size_[hd]) % host_size_[hd];
      if (hd == hs)
        local.emplace_back(within, d);
      else
        remote.emplace_back(static_cast<int64_t>((hd - hs + hosts_) % hosts_) * n_ + within, d);
    }
    std::sort(remote.begin(), remote.end());
    std::sort(local.begin(), local.end());
    const int64_t r = static_cast<int64_t>(remote.size()), l = static_cast<int64_t>(local.size());
    int64_t acc = 0;
    size_t next_local = 0;
    auto emit = [&](int d) {
      phase.push_back(s * n_ + d);
      bytes.push_back(demand[static_cast<size_t>(s) * n_ + d]);
    };
    for (const auto& rd : remote) {
      emit(rd.second);
      acc += l;
      while (acc >= r && next_local < local.size()) {
        emit(local[next_local++].second);
        acc -= r;
      }
    }
    for (; next_local < local.size(); ++next_local) emit(local[next_local].second);
  }
  dec.pairs.push_back(std::move(phase));
  dec.bytes.push_back(std::move(bytes));
  return dec;
}

// A lower bound on the cost-model cost of any plan, from the most loaded link l (m pairs cross
// it, the largest with b bytes): with P phases using l, each pays the start latency, and in each
// phase the t-th largest transfer on l is delivered while at least t share it, at bandwidth *
// eta(t) at most; rank t holds at most P * b bytes over the plan.  Minimised over P.  Without
// eta (fluid, copy engines) this is one start latency plus l's time, the plain bound.
double Scheduler::plan_floor(const std::vector<int64_t>& demand, const std::vector<double>& load, double bound_s,
                             HotLink* hot_link) const {
  int hot = 0;
  for (size_t l = 1; l < load.size(); ++l)
    if (load[l] / link_bw_[l] > load[hot] / link_bw_[hot]) hot = static_cast<int>(l);
  HotLink h;
  h.link = hot;
  h.loads = &load;
  h.load = load[hot];
  h.bw = link_bw_[hot];
  h.bound_s = bound_s;
  // The pairs crossing the hot link (the topology's link -> pairs index; no scan of all pairs).
  for (int k = lp_off_[hot]; k < lp_off_[hot + 1]; ++k) {
    const int p = lp_[k];
    if (demand[p] <= 0) continue;
    ++h.pairs;
    h.biggest = std::max(h.biggest, static_cast<double>(demand[p]));
  }
  if (hot_link) *hot_link = h;
  if (model_.eta_beta <= 0.0 || h.pairs == 0) return latency_s_ + bound_s;
  double best = std::numeric_limits<double>::infinity();
  for (int phases = 1; phases <= h.pairs; ++phases) best = std::min(best, floor_at(h, phases, best));
  return std::max(best, latency_s_ + bound_s);
}

// The plan floor for plans of exactly `phases` phases (see plan_floor(); a plan with fewer
// phases on the hot link pays at least as much).  Stops adding once `stop` is reached.
double Scheduler::floor_at(const HotLink& h, int phases, double stop) const {
  const double plain = phases * latency_s_ + h.bound_s;
  if (model_.eta_beta <= 0.0 || h.pairs == 0) return plain;
  double left = h.load, cost = phases * latency_s_;
  for (int rank = 1; left > 0.0 && cost < stop; ++rank) {
    const double take = std::min(left, phases * h.biggest);
    cost += take / (h.bw * eta(rank));
    left -= take;
  }
  return std::max(cost, plain);
}

// Whether the event model may cost `dec` fused by `merge`: its work grows with the flows of a
// phase times their completions, so fused phases over kMaxSimulatedPhaseFlows transfers, or
// plans over kMaxSimulatedFlows transfers in all, are not simulated (nor chosen; the unfused
// link-greedy plan is always exact).  Transfers repeated inside a run count once per channel
// phase: an upper bound, enough for a cap.
bool Scheduler::affordable(const Decomposition& dec, int merge) const {
  std::size_t total = 0, largest = 0;
  for (size_t start = 0; start < dec.pairs.size(); start += merge) {
    std::size_t flows = 0;
    for (size_t i = start; i < std::min(dec.pairs.size(), start + static_cast<size_t>(merge)); ++i)
      flows += dec.pairs[i].size();
    largest = std::max(largest, flows);
    total += flows;
  }
  return largest <= kMaxSimulatedPhaseFlows && total <= kMaxSimulatedFlows;
}

// Under contention, fusing phases saves start latency but derates shared links; when the
// unfused plan's start latency is under kFuseLatencyShare of its cost, the saving cannot pay
// for the derating in practice, so fused variants are not even bounded (planning time).
// Under `fluid` and copy-engine queues fusing can also overlap the phases' tails, so it is
// always tried there.
bool Scheduler::worth_fusing(int phases, double unfused_bound) const {
  if (model_.eta_beta <= 0.0) return true;
  return static_cast<double>(phases) * latency_s_ >= kFuseLatencyShare * unfused_bound;
}

std::vector<Phase> Scheduler::plan_info(const std::vector<int64_t>& demand, PlanInfo* info) const {
  validate_demand(demand);
  int64_t top = 0;
  for (size_t p = 0; p < demand.size(); ++p)
    if (pair_src_[p] != pair_dst_[p]) top = std::max(top, demand[p]);
  if (info) *info = PlanInfo{};
  if (top == 0) return {};
  double bound_s = 0.0;
  std::vector<double> load;  // bytes per link
  const std::vector<double> weight = pair_urgency(demand, &bound_s, &load);
  const std::vector<int64_t> qs = quanta(top, bound_s);
  std::vector<Decomposition> decs;
  // No plan costs less than plan_floor(): an exact link-greedy plan within kGoodEnough of it is
  // taken without building the others.
  HotLink hot;
  const double floor_s = plan_floor(demand, load, bound_s, &hot);
  const int hot_pairs = hot.pairs;
  double best_exact = std::numeric_limits<double>::infinity();
  // Past kMaxSimulatedRanks ranks the link-greedy pass runs only within its work budget; split
  // peer rounds stand in for it.
  size_t active_pairs = 0;
  for (size_t p = 0; p < demand.size(); ++p) active_pairs += pair_src_[p] != pair_dst_[p] && demand[p] > 0;
  const bool link_pass = (candidates_ & kLinkGreedy) &&
                         (n_ <= kMaxSimulatedRanks || static_cast<double>(hot_pairs) * static_cast<double>(active_pairs) <= kLinkGreedyWork);
  const bool split_pass = (candidates_ & kLinkGreedy) && n_ > kMaxSimulatedRanks && !link_pass;
  LinkScratch ls(link_bw_.size(), pair_links_.size(), static_cast<size_t>(n_));
  // Without eta or copy-engine queues one phase with the whole demand costs the plan floor (see
  // below); an unfused link-greedy or split plan has at least as many phases as the hot link has
  // pairs, so when their start latencies alone exceed kGoodEnough of the floor none of those
  // plans can be taken early, and the one-phase plan is returned without building them.
  const bool plain_model = model_.eta_beta <= 0.0 && model_.copy_engines == 0;
  if (plain_model && (candidates_ & kDirect) &&
      static_cast<double>(hot.pairs) * latency_s_ + bound_s > (1.0 + kGoodEnough) * floor_s) {
    Decomposition dec = direct_decomposition(demand);
    if (info) *info = PlanInfo{floor_s, 1, 1, 0.0, 0, dec.family, 1, 0};
    return materialize(dec.pairs, dec.bytes, 1);
  }
  std::vector<int64_t> passes = link_pass ? link_passes(qs, top) : std::vector<int64_t>{};
  if (split_pass) passes.push_back(-1);
  // Split rounds are sliced under contention when the hot link's pairs need under
  // kSliceLatencyShare of the plan's time in start latencies (bandwidth-bound sizes, where the
  // unfused plan wins); below, whole pairs (fewer transfers, cheaper bounds).
  const bool sliced = model_.eta_beta > 0.0 && static_cast<double>(hot_pairs) * latency_s_ < kSliceLatencyShare * bound_s;
  // Under eta each link-greedy pass is also offered backfilled (backfill()), unfused only: its
  // fused runs stay built from the plain pass, whose phases fuse better (the backfilled ones,
  // fused, lost up to 3 % at 1-16 MB).  They go after the plain passes: decs.front() is the
  // time-sharing search's start, which the plain phases seed better (gen4 hot4-50 256 MB:
  // 1.034x against 1.077x the lower bound).
  const bool backfilled = (candidates_ & kBackfill) && model_.eta_beta > 0.0 && model_.copy_engines == 0 &&
                          n_ <= kMaxSimulatedRanks &&
                          static_cast<double>(hot_pairs) * latency_s_ <= kBackfillLatencyShare * bound_s;
  std::vector<Decomposition> filled;
  auto bound_unfused = [&](Decomposition& dec) {  // true: good enough to end the search
    bool exact = true;
    uint64_t sig = 0;
    const double cost = merged_bound(dec, 1, &ls, &exact, &sig);
    dec.bound1 = cost;
    dec.exact1 = exact;
    dec.sig1 = sig;
    dec.have1 = true;
    if (exact) best_exact = std::min(best_exact, cost);
    return exact && cost <= (1.0 + kGoodEnough) * floor_s;
  };
  auto unfused_plan = [&](const Decomposition& dec) {
    if (info)
      *info = PlanInfo{dec.bound1, static_cast<int>(dec.pairs.size()), 1, static_cast<double>(dec.quantum), 0,
                       dec.family, 1, 0, dec.backfilled};
    return materialize(dec.pairs, dec.bytes, 1);
  };
  for (int64_t q : passes) {
    decs.push_back(q < 0 ? split_peer_decomposition(demand, weight, sliced) : link_decomposition(demand, q, top));
    if (bound_unfused(decs.back())) return unfused_plan(decs.back());
    if (!backfilled || q < 0) continue;
    Decomposition extra = decs.back();
    if (!backfill(&extra)) continue;
    extra.backfilled = true;
    if (bound_unfused(extra)) return unfused_plan(extra);
    filled.push_back(std::move(extra));
  }
  for (Decomposition& dec : filled) decs.push_back(std::move(dec));
  // Without eta derating or copy-engine queues the cost model charges a phase its start latency
  // plus its busiest link's time, so the whole demand in one phase costs exactly the plan floor
  // and no other candidate can beat it: the first link-greedy decomposition fused into one.
  if (!decs.empty() && model_.eta_beta <= 0.0 && model_.copy_engines == 0) {
    const Decomposition& dec = decs.front();
    const int all = static_cast<int>(dec.pairs.size());
    if (info)
      *info = PlanInfo{floor_s, all, all, static_cast<double>(dec.quantum), 0, dec.family, 1, 0};
    return materialize(dec.pairs, dec.bytes, all);
  }
  const bool catalog_may_pay = best_exact > (1.0 + kCatalogGain) * floor_s && model_.eta_beta <= 0.0;
  other_decompositions(demand, weight, top, catalog_may_pay, &decs);
  // Host rounds are one phase whose worth lies in its queue order, which only the event model
  // sees: offered on several hosts under copy-engine queues up to kMaxSimulatedRanks ranks, and
  // always simulated (like the baselines' own plans).
  if ((candidates_ & kHostRounds) && hosts_ > 1 && model_.copy_engines > 0 && n_ <= kMaxSimulatedRanks)
    decs.push_back(host_rounds_decomposition(demand));
  if (timeshare_ && (candidates_ & kTimeShare) &&
      static_cast<double>(active_pairs) * latency_s_ <= kTimeShareLatencyShare * bound_s) {
    Decomposition shared = time_share_decomposition(demand);
    if (!shared.pairs.empty()) decs.push_back(std::move(shared));
  } else if (!timeshare_ && (candidates_ & kTimeShare) && n_ <= kTimeShareSearchRanks && model_.eta_beta > 0.0 &&
             model_.copy_engines == 0 && !decs.empty() && decs.front().family == kLinkGreedy &&
             static_cast<double>(active_pairs) * latency_s_ <= kTimeShareSearchLatencyShare * bound_s) {
    const int rounds = static_cast<int>(std::min<double>(kTimeShareRounds, kTimeSharePlanShare * bound_s / kTimeShareRoundCostS));
    Decomposition shared = time_share_search_decomposition(demand, decs.front(), rounds);
    if (!shared.pairs.empty()) decs.push_back(std::move(shared));
  }
  // Every (decomposition, merge factor 1, 2, 4, ..., all) is a candidate.  Their lower bounds
  // are cheap; the event model is run only for candidates whose bound can still beat the best
  // cost found, in increasing bound order (branch and bound, deterministic order).
  struct Candidate {
    double bound;
    int dec, merge;
    bool exact;
    bool reference;  // the peer-round or direct plan itself (see below)
    int groups = -1;  // index of its per-group bounds in group_bounds (merged_cost()), or -1
    int tie = 0;      // order among equal bounds, before the decomposition's index (see below)
    bool operator<(const Candidate& o) const {
      return bound != o.bound ? bound < o.bound : tie != o.tie ? tie < o.tie : dec != o.dec ? dec < o.dec : merge < o.merge;
    }
  };
  std::vector<Candidate> cands;
  // Per-group bounds of the candidates that may be simulated (several groups): merged_cost()
  // stops once the groups done plus the bounds of those left reach what it must beat.
  std::vector<std::vector<double>> group_bounds;
  // Candidates whose fused phases are identical (the same decomposition from two passes; every
  // decomposition fused into one phase when the order does not matter) are costed once: the
  // first one generated, which is also first among equal bounds.
  std::vector<uint64_t> seen;
  // Without copy-engine queues the order inside a phase does not matter, so any decomposition
  // fused into one phase is the direct plan: when that is a candidate, the others' are not built.
  const bool have_direct = std::any_of(decs.begin(), decs.end(), [](const Decomposition& x) { return x.family == kDirect; });
  const bool skip_all = have_direct && model_.copy_engines == 0;
  // Past kMaxSimulatedRanks ranks candidates are ranked by their bounds, so one whose cheap
  // floor (its start latencies plus the busiest link's time) already reaches the best bound
  // found cannot win and is not bounded; the direct plan goes first (usually the best at small
  // sizes, where the fused runs' latencies decide).
  const bool prune = n_ > kMaxSimulatedRanks;
  std::vector<Candidate> fused;
  PeerLoads peer_bytes;            // the peer rounds' bytes on the busiest links (early-stop floors)
  std::vector<double> floor_sums;  // their per-group floors, prefix sums
  double best_bound = std::numeric_limits<double>::infinity();
  std::vector<size_t> dec_order(decs.size());
  for (size_t d = 0; d < decs.size(); ++d) {
    dec_order[d] = d;
    if (decs[d].have1) best_bound = std::min(best_bound, decs[d].bound1);
  }
  if (prune)  // already bounded (the exact link-greedy or split plan) first, then direct
    std::stable_partition(dec_order.begin(), dec_order.end(),
                          [&](size_t d) { return decs[d].have1 || decs[d].family == kDirect; });
  for (size_t d : dec_order) {
    const int count = static_cast<int>(decs[d].pairs.size());
    bool fusing_proven = false;  // worth_fusing() shown by peer_upper_simple() (peer rounds)
    if (prune) {
      // Unfused plans now (those whose floor cannot beat the best bound are left out); fused runs
      // below, best first.
      const double floor1 = decs[d].have1 ? decs[d].bound1 : floor_at(hot, count, best_bound);
      double b1 = floor1;  // the unfused bound, or its floor when that cannot win
      if (decs[d].have1 || floor1 < best_bound) {
        bool exact = true;
        if (!decs[d].have1) {
          // Stopped early (+inf) once it can neither win nor make its fused runs worth
          // bounding (worth_fusing() is false past count x latency / kFuseLatencyShare).
          double stop = model_.eta_beta > 0.0
                            ? std::max(best_bound, static_cast<double>(count) * latency_s_ / kFuseLatencyShare) * (1.0 + 1e-9)
                            : best_bound;
          const std::vector<double>* fl = nullptr;
          if (decs[d].family == kPeerRounds) {
            peer_loads(demand, decs[d], load, bound_s, &peer_bytes);
            peer_floor_prefix(peer_bytes, decs[d].pairs.size(), 1, &floor_sums);
            fl = &floor_sums;
          }
          if (decs[d].family == kPeerRounds && model_.eta_beta > 0.0 && stop > best_bound * (1.0 + 1e-9)) {
            // The pass would run on past the best bound only to tell whether the fused runs are
            // worth bounding.  When an upper bound of the unfused bound already shows they are,
            // it stops at the best bound (a plan that cannot win is not a candidate;
            // worth_fusing() holds either way).
            const double simple = peer_upper_simple(decs[d]);
            if (worth_fusing(count, simple * (1.0 + 1e-6))) {
              stop = best_bound;
              fusing_proven = true;
            } else if (simple <= kPeerTableReach * stop && floor_sums.back() >= kPeerTableFloor * best_bound &&
                       worth_fusing(count, peer_upper_rounds(decs[d], &ls) * (1.0 + 1e-6))) {
              // The per-round upper bound costs a walk over the transfers: built only when it
              // should pay, i.e. the simple bound is within kPeerTableReach of the threshold and
              // the pass stopped at the best bound would end early (its floor is near the best
              // bound, so the plan cannot win).
              stop = best_bound;
              fusing_proven = true;
            }
          }
          b1 = merged_bound(decs[d], 1, &ls, &exact, nullptr, nullptr, &hot, stop, std::numeric_limits<double>::infinity(), fl);
        }
        if (decs[d].have1) exact = decs[d].exact1;
        const bool reference = decs[d].family == kPeerRounds || decs[d].family == kDirect;
        if (!std::isinf(b1)) {
          cands.push_back({b1, static_cast<int>(d), 1, exact, reference});
          best_bound = std::min(best_bound, b1);
        }
      }
      if (count == 1 || decs[d].backfilled || (!fusing_proven && !worth_fusing(count, b1))) continue;
      for (int m : {count, kMaxMergeManyRanks, 4, 2}) {
        if (m >= count && (m != count || skip_all)) continue;
        // With copy-engine queues peer rounds in one phase never beat split rounds in one phase
        // (64 ranks): the budget goes to runs of 8 instead.
        if (model_.copy_engines > 0 && m == count && decs[d].family == kPeerRounds) continue;
        fused.push_back({floor_at(hot, (count + m - 1) / m, std::numeric_limits<double>::infinity()), static_cast<int>(d), m, false, false});
      }
      continue;
    }
    for (int merge = 1;; merge *= 2) {
      // Past kMaxSimulatedRanks ranks: 1, 2, 4, 8, then all phases in one.
      const bool skip_to_all = n_ > kMaxSimulatedRanks && merge > kMaxMergeManyRanks;
      const int m = skip_to_all ? count : std::min(merge, count);
      if (m == count && m > 1 && skip_all) break;
      if (prune && m > 1 && static_cast<double>((count + m - 1) / m) * latency_s_ + bound_s >= best_bound) {
        if (m >= count) break;
        continue;
      }
      bool exact = true;
      uint64_t sig = 0;
      const bool signed_ = n_ <= kMaxSimulatedRanks;  // past it nothing is simulated: no need
      std::vector<double> per_group;
      const double bound = m == 1 && decs[d].have1
                               ? decs[d].bound1
                               : merged_bound(decs[d], m, &ls, &exact, signed_ ? &sig : nullptr, signed_ ? &per_group : nullptr);
      if (m == 1 && decs[d].have1) {
        exact = decs[d].exact1;
        sig = decs[d].sig1;
      }
      const bool reference =
          m == 1 && (decs[d].family == kPeerRounds || decs[d].family == kDirect || decs[d].family == kHostRounds);
      const size_t twin = signed_ ? static_cast<size_t>(std::find(seen.begin(), seen.end(), sig) - seen.begin())
                                  : seen.size();
      if (twin < seen.size()) {
        // Keep one copy; it is a reference if either is, and simulated if either may be.
        Candidate& kept = cands[twin];
        kept.reference = kept.reference || reference;
        if (!affordable(decs[kept.dec], kept.merge) && affordable(decs[d], m)) {
          kept.dec = static_cast<int>(d);
          kept.merge = m;
        }
        if (m == 1) break;  // the whole decomposition repeats an earlier one
      } else {
        seen.push_back(sig);
        cands.push_back({bound, static_cast<int>(d), m, exact, reference});
        if (per_group.size() > 1) {
          cands.back().groups = static_cast<int>(group_bounds.size());
          group_bounds.push_back(std::move(per_group));
        }
        best_bound = std::min(best_bound, bound);
      }
      // Fusing a time-sharing plan's phases would change the configurations it was solved for.
      if (m >= count || !worth_fusing(count, bound) || decs[d].family == kTimeShare || decs[d].backfilled) break;
      // With copy-engine queues (no eta) on one host (<= 16 ranks) fused runs of a few phases
      // never won in the benchmark: the choice is between the unfused plan and one phase in that
      // order.  (With several hosts they do win.)
      if (model_.copy_engines > 0 && model_.eta_beta <= 0.0 && n_ <= kCatalogMaxRanks)
        merge = std::max(merge, count / 2 + 1);
    }
  }
  if (prune) {
    // Fused runs in increasing order of their latency-aware floor (floor_at(), a lower bound on
    // their bound); stop when the floor reaches the best bound, or when the deterministic budget
    // of kFusedBoundPasses passes over the transfers is spent.
    // A fused run that is not exact is charged its margins (kQueueMargin, kFusedMargin).  Runs
    // of whole split peer rounds are never exact (first fit put each pair of a phase after a
    // phase where one of its links was taken, so two fused phases share a link), so one whose
    // charged floor reaches the best bound cannot win and is skipped without a pass.
    auto margin = [&](const Candidate& f) {
      double x = 1.0;
      if (model_.copy_engines > 0 && decs[f.dec].family == kSplitPeer) x *= 1.0 + kQueueMargin;
      if (model_.eta_beta > 0.0) x *= 1.0 + kFusedMargin * std::log2(static_cast<double>(f.merge));
      return x;
    };
    std::sort(fused.begin(), fused.end());
    int passes = 0;
    const int budget = model_.copy_engines > 0 ? kFusedBoundPassesQueued : kFusedBoundPasses;
    for (const Candidate& f : fused) {
      if (f.bound >= best_bound || passes >= budget) break;
      if (decs[f.dec].family == kSplitPeer && decs[f.dec].unique && f.bound * margin(f) >= best_bound) continue;
      bool ex = true;
      // Stopped early once it provably cannot reach best_bound (with its margins once inexact).
      const std::vector<double>* fl = nullptr;
      if (decs[f.dec].family == kPeerRounds) {
        if (peer_bytes.phases != decs[f.dec].pairs.size() || peer_bytes.links.empty())
          peer_loads(demand, decs[f.dec], load, bound_s, &peer_bytes);
        peer_floor_prefix(peer_bytes, decs[f.dec].pairs.size(), f.merge, &floor_sums);
        fl = &floor_sums;
      }
      double bound = merged_bound(decs[f.dec], f.merge, &ls, &ex, nullptr, nullptr, &hot, best_bound,
                                  best_bound / margin(f) * (1.0 + 1e-9), fl);
      ++passes;
      if (!ex) bound *= margin(f);
      cands.push_back({bound, f.dec, f.merge, ex, false});
      best_bound = std::min(best_bound, bound);
    }
  }
  // With copy-engine queues (no eta) on one host the candidates simulated are one-phase orders
  // of equal bounds (the plain link load) whose event-model costs differ by a few percent; the
  // catalog's and the peer rounds' orders, the ones that most often reach the plan floor, go
  // first among equal bounds, so that the search below usually ends at the first or second
  // simulation (kGoodEnough; small sizes, see kGoodEnoughAbs).
  const bool stop_good_enough = kGoodEnough * floor_s <= kGoodEnoughAbs;
  if (stop_good_enough && model_.copy_engines > 0 && model_.eta_beta <= 0.0 && n_ <= kCatalogMaxRanks)
    for (Candidate& c : cands) {
      const int fam = decs[c.dec].family;
      c.tie = fam == kCatalogChannels ? 0 : fam == kPeerRounds ? 1 : fam == kLinkGreedy ? 2 : 3;
    }
  std::sort(cands.begin(), cands.end());
  double best_cost = std::numeric_limits<double>::infinity();
  const Candidate* best = nullptr;
  int simulated = 0;
  // The cheapest exact candidate (its bound is its cost, under every model) is reached by the
  // loop below unless a cheaper one wins first, so a simulation that cannot beat it is stopped
  // early; a simulated candidate must beat it by the same relative margin as any incumbent
  // (an event-model tie goes to the exact plan).
  double exact_best = std::numeric_limits<double>::infinity();
  for (const Candidate& c : cands)
    if (c.exact) exact_best = std::min(exact_best, c.bound * (1.0 - 1e-12));
  for (const Candidate& c : cands) {
    if (c.bound >= best_cost * (1.0 - 1e-12)) break;
    // The event model is the expensive part of planning: past kMaxSimulated candidates only
    // exact ones (no shared link) are still considered.
    // Past kMaxSimulatedRanks ranks the event model is not run at all: candidates are ranked
    // by their bounds (planning time); below, unaffordable candidates are skipped.
    const bool by_bound = c.exact || n_ > kMaxSimulatedRanks;
    // The baselines' own plans (peer rounds, direct) are always costed, outside the budget
    // (unless a plan within kGoodEnough of the floor ended the search), so the choice never
    // trails them by more than kGoodEnough plus the event model's error.
    if (!by_bound && ((simulated >= kMaxSimulated && !c.reference) || !affordable(decs[c.dec], c.merge))) continue;
    simulated += by_bound ? 0 : 1;
    const double cost = by_bound ? c.bound
                                 : merged_cost(decs[c.dec].pairs, decs[c.dec].bytes, c.merge, &ls, std::min(best_cost, exact_best),
                                               c.groups >= 0 ? &group_bounds[c.groups] : nullptr);
    if (cost < best_cost * (1.0 - 1e-12)) {
      best_cost = cost;
      best = &c;
      // No plan costs less than the plan floor: one within kGoodEnough of it ends the search, as
      // an exact link-greedy plan does above (the plan taken is then at most kGoodEnough, and
      // at most kGoodEnoughAbs seconds, above the best candidate's cost).
      if (stop_good_enough && best_cost <= (1.0 + kGoodEnough) * floor_s) break;
    }
  }
  const Decomposition& dec = decs[best->dec];
  if (info)
    *info = PlanInfo{best_cost, static_cast<int>(dec.pairs.size()), best->merge, static_cast<double>(dec.quantum),
                     dec.family == kPeerRounds ? 1 : 0, dec.family, static_cast<int>(cands.size()), simulated,
                     dec.backfilled};
  return materialize(dec.pairs, dec.bytes, best->merge);
}

}  // namespace varipath
}  // namespace hoccl
