// Backfilled link-greedy plans (a kBackfill variant of the link-greedy family).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"

namespace hoccl {
namespace varipath {

namespace {

// A budget of link checks per decomposition (a count, never a clock).
constexpr double kBackfillWork = 131072.0;

}  // namespace

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
bool backfill(const Network& net, const ModelTables& model, Decomposition* dec) {
  const size_t phases = dec->pairs.size();
  if (phases < 2 || model.copy_engines > 0) return false;
  const size_t links = net.link_bw.size();
  const size_t words = (net.pair_links.size() + 63) / 64;
  std::vector<double> span(phases, 0.0);            // each phase's longest transfer alone
  std::vector<int> flows(phases * links, 0);        // phase-major: flows on each link
  std::vector<double> biggest(phases * links, 0.0); // and the largest of their bytes
  std::vector<uint64_t> member(phases * words, 0);  // pairs in each phase
  // Tentative moves of the phase being emptied: (phase * links + link, its biggest before).
  std::vector<std::pair<size_t, double>> undo;
  auto add = [&](size_t i, int p, double b, bool logged) {
    member[i * words + p / 64] |= uint64_t{1} << (p % 64);
    for (int l : net.links_of(p)) {
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
      span[i] = std::max(span[i], b / net.pair_min_bw[p]);
      add(i, p, b, false);
    }
  std::vector<int> longest(phases);  // destinations, longest first (ties: plan order)
  for (size_t i = 0; i < phases; ++i) longest[i] = static_cast<int>(i);
  std::stable_sort(longest.begin(), longest.end(), [&](int a, int b) { return span[a] > span[b]; });
  // A transfer fits in phase d when every link of its path keeps each flow within the share.
  double work = kBackfillWork;
  auto fits = [&](int d, int p, double b) {
    for (int l : net.links_of(p)) {
      work -= 1.0;
      const int k = flows[d * links + l] + 1;
      if (std::max(biggest[d * links + l], b) > span[d] * net.link_bw[l] * model.eta(k) / k) return false;
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
        if (span[d] <= span[*q] || b > span[d] * net.pair_min_bw[p] || work <= 0.0) break;
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

}  // namespace varipath
}  // namespace hoccl
