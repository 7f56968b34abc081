// VarioPath time-sharing plans for small groups: the optimal split of a demand over every set
// of concurrent transfers, under the contention model.
//
// Under max-min sharing with eta(k) per link the rates of the running transfers depend only on
// which transfers run.  A plan's execution is therefore a sequence of intervals, each a fixed set
// of running transfers (a configuration) at that set's rates, and the best any plan can do is the
// optimum of the LP
//
//     minimise sum_c x_c   subject to   sum_c x_c * rate_c(p) >= demand(p) for every pair p
//
// (x_c: seconds spent in configuration c; phase start latencies come on top).  With P pairs
// there are 2^P - 1 configurations, so the table is built for P <= kMaxPairs (4 GPUs, 12
// pairs): once per link and cost model, since the rates do not depend on the demand.  solve()
// runs a revised simplex over the configurations whose transfers all have demand.
//
// Pure C++17 (standard library only), deterministic (fixed scan orders and tie-breaks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace hoccl {
namespace varipath {

class TimeShareTable {
 public:
  static constexpr int kMaxPairs = 12;

  // pairs: the transfers (any ids, kept in this order); links[i]: the link indices on pair i's
  // path; link_bw: capacity per link; eta[k]: the fraction of a link's capacity k concurrent
  // flows get (eta[0], eta[1] unused, k past the table end uses the last entry).
  TimeShareTable(std::vector<int> pairs, const std::vector<std::vector<int>>& links,
                 const std::vector<double>& link_bw, const std::vector<double>& eta);

  int size() const { return static_cast<int>(pairs_.size()); }
  const std::vector<int>& pairs() const { return pairs_; }
  // Rate (bytes/s) of member i (bit i of mask) when exactly the members of mask run; 0 if i is
  // not a member.
  double rate(uint32_t mask, int i) const { return rates_[(static_cast<size_t>(i) << pairs_.size()) + mask]; }

  // The optimal time-sharing of demand[i] bytes for pair i (0 = no transfer): (configuration,
  // seconds) with seconds > 0, longest first.  Every configuration used contains only pairs
  // with demand.  Bounded work: at most kMaxPivots pivots, after which the last feasible basis
  // is returned (still a valid cover, not necessarily optimal).
  std::vector<std::pair<uint32_t, double>> solve(const std::vector<double>& demand) const;

 private:
  static constexpr int kMaxPivots = 256;
  std::vector<int> pairs_;
  // Pair-major: rates_[i * 2^P + mask] (configuration 0, the empty set, has rate 0 everywhere).
  std::vector<double> rates_;
  // Per configuration, the pairs that can join it for free (no member's rate drops): such a
  // configuration is never needed when those pairs have demand, since the larger one moves at
  // least as much of every pair in the same time.  On direct4 this leaves 552 of 4095.
  std::vector<uint32_t> free_join_;
};

// Column generation for groups too large to table every configuration (8 GPUs: 2^56).  The
// LP starts from every transfer alone plus `start` (configurations given as lists of indices
// into `links`, e.g. a plan's phases) and adds, for at most `rounds` rounds, the configuration a
// greedy pricing step finds (grow a set by the transfer that raises its dual value most, rates
// from max-min sharing with eta), while one improves the LP.  links, demand: per transfer (every
// demand > 0).  Returns the configurations used: members, their rates (bytes/s), and seconds.
struct TimeShareColumn {
  std::vector<int> members;
  std::vector<double> rates;
  double seconds = 0.0;
};
std::vector<TimeShareColumn> time_share_search(const std::vector<std::vector<int>>& links,
                                               const std::vector<double>& link_bw, const std::vector<double>& eta,
                                               const std::vector<double>& demand,
                                               const std::vector<std::vector<int>>& start, int rounds);

}  // namespace varipath
}  // namespace hoccl
