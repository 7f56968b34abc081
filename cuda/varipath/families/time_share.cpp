// Time-sharing plans: the LP-optimal split of the demand over sets of concurrent transfers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"

namespace hoccl {
namespace varipath {

// The configuration table of time-sharing plans: only under eta (without it one phase with the
// whole demand is already optimal, and copy-engine queues make rates depend on the order) and
// for at most TimeShareTable::kMaxPairs pairs (4 GPUs: 4095 configurations).
std::shared_ptr<const TimeShareTable> time_share_table(const Network& net, const ModelTables& model) {
  const int pairs = net.n * (net.n - 1);
  if (model.eta_beta <= 0.0 || model.copy_engines > 0 || pairs < 2 || pairs > TimeShareTable::kMaxPairs) return nullptr;
  std::vector<int> ids;
  std::vector<std::vector<int>> links;
  for (int p = 0; p < net.n * net.n; ++p) {
    if (net.pair_src[p] == net.pair_dst[p]) continue;
    ids.push_back(p);
    links.push_back(net.pair_links[p]);
  }
  return std::make_shared<const TimeShareTable>(std::move(ids), links, net.link_bw, model.eta_upto(pairs));
}

namespace {

// Time-sharing plans are built only when one start latency per transfer stays under this share
// of the plan's lower bound (256 MB per rank and up on direct4): their phases (up to one per
// pair) pay start latencies that the LP does not see, and building and costing one takes
// 0.2-0.4 ms of planning on the CI VM, which the 3-9 % shorter plans repay only on long exchanges.
constexpr double kTimeShareLatencyShare = 0.01;
// Past 4 GPUs, up to kTimeShareSearchRanks, time-sharing plans come from column generation,
// built when one start latency per pair is at most kTimeShareSearchLatencyShare of the plan's
// lower bound (256 MB per rank and up on the 8-GPU presets, exchanges of 17 ms and more).  Its
// pricing rounds are budgeted by the stakes: about kTimeSharePlanShare of that lower bound at
// kTimeShareRoundCostS per round (a round's planning time on 8 GPUs measured on the CI VM,
// 25-37 us with the LP's columns kept sparse; a count, never a clock, so every rank decides
// alike), at most kTimeShareRounds.
constexpr int kTimeShareSearchRanks = 8;
constexpr int kTimeShareRounds = 96;
constexpr double kTimeShareSearchLatencyShare = 0.03;
constexpr double kTimeSharePlanShare = 0.03;
constexpr double kTimeShareRoundCostS = 35e-6;

// A time-sharing plan: one phase per configuration used (longest first), each pair's bytes
// split over its phases in proportion to time x rate and scaled to its demand (the LP covers it,
// possibly with some to spare), rounding remainders in the pair's largest piece.  ids: the pair
// id of each member index.
Decomposition time_share_plan(const std::vector<int>& ids, const std::vector<int64_t>& demand,
                              const std::vector<TimeShareColumn>& used) {
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
Decomposition time_share_decomposition(const TimeShareTable& table, const std::vector<int64_t>& demand) {
  const std::vector<int>& ids = table.pairs();
  std::vector<double> want(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) want[i] = static_cast<double>(demand[ids[i]]);
  std::vector<TimeShareColumn> used;
  for (const auto& [mask, secs] : table.solve(want)) {
    TimeShareColumn c;
    for (size_t i = 0; i < ids.size(); ++i)
      if ((mask >> i) & 1u) {
        c.members.push_back(static_cast<int>(i));
        c.rates.push_back(table.rate(mask, static_cast<int>(i)));
      }
    c.seconds = secs;
    used.push_back(std::move(c));
  }
  return time_share_plan(ids, demand, used);
}

// Past 4 GPUs: column generation (time_share_search()) over the demanded pairs, started from
// the phases of `start` (the first link-greedy decomposition).
Decomposition time_share_search_decomposition(const Network& net, const ModelTables& model,
                                              const std::vector<int64_t>& demand, const Decomposition& start,
                                              int rounds) {
  std::vector<int> ids, index_of(demand.size(), -1);
  std::vector<std::vector<int>> links;
  std::vector<double> want;
  for (size_t p = 0; p < demand.size(); ++p) {
    if (net.pair_src[p] == net.pair_dst[p] || demand[p] <= 0) continue;
    index_of[p] = static_cast<int>(ids.size());
    ids.push_back(static_cast<int>(p));
    links.push_back(net.pair_links[p]);
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
                         time_share_search(links, net.link_bw, model.eta_upto(static_cast<int>(ids.size())), want, phases, rounds));
}

}  // namespace

bool build_time_share(PlanSearch* s) {
  const double latencies = static_cast<double>(s->active_pairs) * s->net.latency_s;
  if (s->timeshare && latencies <= kTimeShareLatencyShare * s->bound_s) {
    Decomposition shared = time_share_decomposition(*s->timeshare, s->demand);
    if (!shared.pairs.empty()) s->decs.push_back(std::move(shared));
  } else if (!s->timeshare && s->net.n <= kTimeShareSearchRanks && s->model.eta_beta > 0.0 &&
             s->model.copy_engines == 0 && !s->decs.empty() && s->decs.front().family == kLinkGreedy &&
             latencies <= kTimeShareSearchLatencyShare * s->bound_s) {
    const int rounds =
        static_cast<int>(std::min<double>(kTimeShareRounds, kTimeSharePlanShare * s->bound_s / kTimeShareRoundCostS));
    Decomposition shared = time_share_search_decomposition(s->net, s->model, s->demand, s->decs.front(), rounds);
    if (!shared.pairs.empty()) s->decs.push_back(std::move(shared));
  }
  return false;
}

}  // namespace varipath
}  // namespace hoccl
