#include "varipath/timeshare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace hoccl {
namespace varipath {

namespace {

// Max-min-fair rates of a set of transfers by progressive filling: the link with the smallest
// fair share of its capacity (bandwidth x eta(flows on it)) fixes the rate of its unfrozen
// flows, which then come off their other links; first link touched on ties.  Scratch tables are
// sized to the links and reset only where touched.
class SetRates {
 public:
  SetRates(const std::vector<std::vector<int>>& links, const std::vector<double>& link_bw, const std::vector<double>& eta)
      : links_(links), bw_(link_bw), eta_(eta), count_(link_bw.size(), 0), unfrozen_(link_bw.size(), 0),
        cap_(link_bw.size(), 0.0) {}

  void rates(const std::vector<int>& members, std::vector<double>* out) {
    touched_.clear();
    for (int i : members)
      for (int l : links_[i])
        if (count_[l]++ == 0) touched_.push_back(l);
    for (int l : touched_) {
      const size_t k = std::min(static_cast<size_t>(count_[l]), eta_.size() - 1);
      cap_[l] = bw_[l] * (count_[l] > 1 ? eta_[k] : 1.0);
      unfrozen_[l] = count_[l];
    }
    out->assign(members.size(), -1.0);
    size_t open = members.size();
    while (open > 0) {
      int neck = -1;
      double low = 0.0;
      for (int l : touched_) {
        if (unfrozen_[l] == 0) continue;
        const double share = cap_[l] / unfrozen_[l];
        if (neck < 0 || share < low) {
          neck = l;
          low = share;
        }
      }
      const double level = std::max(low, 0.0);
      for (size_t j = 0; j < members.size(); ++j) {
        if ((*out)[j] >= 0.0) continue;
        const auto& path = links_[members[j]];
        if (std::find(path.begin(), path.end(), neck) == path.end()) continue;
        (*out)[j] = level;
        --open;
        for (int l : path) {
          cap_[l] -= level;
          unfrozen_[l] -= 1;
        }
      }
    }
    for (int l : touched_) count_[l] = unfrozen_[l] = 0;
  }

 private:
  const std::vector<std::vector<int>>& links_;
  const std::vector<double>& bw_;
  const std::vector<double>& eta_;
  std::vector<int> count_, unfrozen_, touched_;
  std::vector<double> cap_;
};

// The covering LP  min sum x_j  s.t.  sum_j a_rj x_j - s_r = 1,  x, s >= 0  (a_rj = rate /
// demand, x_j in seconds) by a revised simplex with a dense B^-1 (rows: the demanded pairs) and
// sparse columns (a configuration holds a few of the pairs).
// The starting basis is feasible: the first `rows` columns, every row's transfer alone
// (x = demand / rate).  Entering column: the most negative reduced cost (Dantzig), or after a
// degenerate pivot the first negative one (Bland, which cannot cycle), columns in the order
// added and then the slacks; leaving row: the smallest ratio among safe pivots, the largest
// pivot among ties, then the first basis position.  The duals are updated with each pivot
// (recomputed at every optimize() call).  Columns may be added between optimize() calls; the
// basis is kept (warm start).
class CoverLp {
 public:
  explicit CoverLp(int rows) : m_(rows), basis_(rows), binv_(static_cast<size_t>(rows) * rows, 0.0), xb_(rows), y_(rows) {}

  // Column j = add(rows, values): its entries a_rj > 0 (rows ascending).  The first `rows`
  // columns must be the rows' own singletons, in row order (the starting basis).
  int add(const std::vector<int>& rows, const std::vector<double>& values) {
    const int j = columns();
    if (j < m_ && (rows.size() != 1 || rows[0] != j || !(values[0] > 0.0)))
      throw std::logic_error("varipath::CoverLp: the first columns must be the rows' singletons");
    rows_.insert(rows_.end(), rows.begin(), rows.end());
    values_.insert(values_.end(), values.begin(), values.end());
    begin_.push_back(static_cast<int>(rows_.size()));
    if (m_ <= kDenseRows) {
      dense_.resize(dense_.size() + m_, 0.0);
      double* col = dense_.data() + static_cast<size_t>(j) * m_;
      for (size_t i = 0; i < rows.size(); ++i) col[rows[i]] = values[i];
    }
    if (j < m_) {
      basis_[j] = j;
      binv_[static_cast<size_t>(j) * m_ + j] = 1.0 / values[0];
      xb_[j] = binv_[static_cast<size_t>(j) * m_ + j];
    }
    return j;
  }

  // Room for `columns` columns with `entries` entries in all (no reallocation while adding).
  void reserve(size_t columns, size_t entries) {
    begin_.reserve(columns + 1);
    rows_.reserve(entries);
    values_.reserve(entries);
    if (m_ <= kDenseRows) dense_.reserve(columns * m_);
  }

  // y = c_B B^-1 as of the last optimize() (every row's price, seconds per unit of coverage).
  const std::vector<double>& duals() const { return y_; }

  void optimize(int max_pivots) {
    recompute_duals();
    bool bland = false;
    std::vector<double> d(m_);
    for (int pivot = 0; pivot < max_pivots; ++pivot) {
      int enter = kNone;
      double best = -1e-9;  // the entering column's reduced cost
      for (int j = 0; j < columns() && !(bland && enter != kNone); ++j) {
        const double reduced = 1.0 - dot(y_, j);
        if (reduced < best) {
          best = reduced;
          enter = static_cast<int>(j);
        }
      }
      for (int r = 0; r < m_ && !(bland && enter != kNone); ++r)
        if (y_[r] < best) {  // row r's slack: column -e_r, cost 0
          best = y_[r];
          enter = -(r + 1);
        }
      if (enter == kNone) return;
      entering_direction(enter, &d);
      double theta = 0.0;
      const int leave = ratio_test(d, &theta);
      if (leave < 0) return;
      bland = theta <= 0.0;
      for (int k = 0; k < m_; ++k) xb_[k] = std::max(xb_[k] - theta * d[k], 0.0);
      xb_[leave] = theta;
      double* lr = binv_.data() + static_cast<size_t>(leave) * m_;
      const double piv = d[leave];
      for (int r = 0; r < m_; ++r) lr[r] /= piv;
      for (int k = 0; k < m_; ++k) {
        if (k == leave || d[k] == 0.0) continue;
        double* kr = binv_.data() + static_cast<size_t>(k) * m_;
        for (int r = 0; r < m_; ++r) kr[r] -= d[k] * lr[r];
      }
      // y' = y + (reduced cost) x (row `leave` of the new B^-1).
      for (int r = 0; r < m_; ++r) y_[r] += best * lr[r];
      basis_[leave] = enter;
    }
  }

  // (column, seconds) of the basic columns with seconds > 0.
  std::vector<std::pair<int, double>> solution() const {
    std::vector<std::pair<int, double>> out;
    for (int k = 0; k < m_; ++k)
      if (basis_[k] >= 0 && xb_[k] > 0.0) out.emplace_back(basis_[k], xb_[k]);
    return out;
  }

 private:
  static constexpr int kNone = std::numeric_limits<int>::min();
  // Pivot entries at most this (relative to the entering column's largest) are not taken: a
  // tiny pivot makes B^-1 numerically singular (seen at 1e-12 on 8 GPUs, which broke the cover).
  static constexpr double kPivotTolerance = 1e-9;
  // Ratios within this relative distance of the smallest are ties, broken by the larger pivot.
  static constexpr double kRatioTie = 1e-9;
  static constexpr int kDenseRows = 16;

  int columns() const { return static_cast<int>(begin_.size()) - 1; }

  double dot(const std::vector<double>& y, int j) const {
    double sum = 0.0;
    if (m_ <= kDenseRows) {
      const double* col = dense_.data() + static_cast<size_t>(j) * m_;
      for (int r = 0; r < m_; ++r) sum += y[r] * col[r];
      return sum;
    }
    for (int i = begin_[j]; i < begin_[j + 1]; ++i) sum += y[rows_[i]] * values_[i];
    return sum;
  }

  void recompute_duals() {
    std::fill(y_.begin(), y_.end(), 0.0);
    for (int k = 0; k < m_; ++k)
      if (basis_[k] >= 0)
        for (int r = 0; r < m_; ++r) y_[r] += binv_[static_cast<size_t>(k) * m_ + r];
  }

  // d = B^-1 a for the entering column (a slack's column is -e_r).
  void entering_direction(int enter, std::vector<double>* d) const {
    if (enter < 0) {
      const int r = -enter - 1;
      for (int k = 0; k < m_; ++k) (*d)[k] = -binv_[static_cast<size_t>(k) * m_ + r];
      return;
    }
    for (int k = 0; k < m_; ++k) {
      const double* row = binv_.data() + static_cast<size_t>(k) * m_;
      double sum = 0.0;
      for (int i = begin_[enter]; i < begin_[enter + 1]; ++i) sum += row[rows_[i]] * values_[i];
      (*d)[k] = sum;
    }
  }

  // The leaving basis position (or -1 when no entry is a safe pivot) and the step, the smallest
  // ratio.
  int ratio_test(const std::vector<double>& d, double* step) const {
    double dmax = 0.0;
    for (int k = 0; k < m_; ++k) dmax = std::max(dmax, d[k]);
    const double tol = kPivotTolerance * std::max(1.0, dmax);
    int leave = -1;
    double theta = 0.0;
    for (int k = 0; k < m_; ++k) {
      if (d[k] <= tol) continue;
      const double t = std::max(xb_[k], 0.0) / d[k];
      const bool smaller = leave < 0 || t < theta * (1.0 - kRatioTie);
      if (smaller || (t <= theta * (1.0 + kRatioTie) && d[k] > d[leave])) {
        leave = k;
        theta = smaller ? t : std::min(theta, t);
      }
    }
    *step = theta;
    return leave;
  }

  int m_;
  // The columns in compressed form: column j's entries are [begin_[j], begin_[j + 1]); with
  // few rows also dense (column-major), which prices faster when most rows are in most columns
  // (the 4-GPU table: 12 rows, 552 columns).
  std::vector<int> begin_{0}, rows_;
  std::vector<double> values_, dense_;
  std::vector<int> basis_;  // column index, or -(r + 1) for row r's slack
  std::vector<double> binv_, xb_, y_;
};

}  // namespace

TimeShareTable::TimeShareTable(std::vector<int> pairs, const std::vector<std::vector<int>>& links,
                               const std::vector<double>& link_bw, const std::vector<double>& eta)
    : pairs_(std::move(pairs)) {
  const int p = static_cast<int>(pairs_.size());
  if (p < 1 || p > kMaxPairs || links.size() != pairs_.size() || eta.size() < 2)
    throw std::invalid_argument("varipath::TimeShareTable: need 1.." + std::to_string(kMaxPairs) +
                                " pairs with their links and an eta table");
  for (const auto& path : links) {
    if (path.empty()) throw std::invalid_argument("varipath::TimeShareTable: a pair has no links");
    for (int l : path)
      if (l < 0 || static_cast<size_t>(l) >= link_bw.size())
        throw std::invalid_argument("varipath::TimeShareTable: link index out of range");
  }
  const uint32_t configs = 1u << p;
  rates_.assign(static_cast<size_t>(configs) * p, 0.0);
  SetRates setrates(links, link_bw, eta);
  std::vector<int> members;
  std::vector<double> r;
  for (uint32_t mask = 1; mask < configs; ++mask) {
    members.clear();
    for (int i = 0; i < p; ++i)
      if ((mask >> i) & 1u) members.push_back(i);
    setrates.rates(members, &r);
    for (size_t j = 0; j < members.size(); ++j) rates_[(static_cast<size_t>(members[j]) << p) + mask] = r[j];
  }
  free_join_.assign(configs, 0);
  for (uint32_t mask = 1; mask < configs; ++mask)
    for (int j = 0; j < p; ++j) {
      const uint32_t bigger = mask | (1u << j);
      if (bigger == mask) continue;
      bool free = true;
      for (int i = 0; i < p && free; ++i)
        if ((mask >> i) & 1u) free = rate(bigger, i) >= rate(mask, i) * (1.0 - 1e-12);
      if (free) free_join_[mask] |= 1u << j;
    }
}

// The LP over the rows with demand and the tabled configurations made of those rows only,
// leaving out those a demanded pair could join for free (CoverLp, from every row's transfer
// alone).
std::vector<std::pair<uint32_t, double>> TimeShareTable::solve(const std::vector<double>& demand) const {
  const int p = size();
  if (demand.size() != pairs_.size())
    throw std::invalid_argument("varipath::TimeShareTable::solve: need one demand per pair");
  std::vector<int> row_pair;  // row -> pair index
  uint32_t active = 0;
  for (int i = 0; i < p; ++i)
    if (demand[i] > 0.0) {
      row_pair.push_back(i);
      active |= 1u << i;
    }
  const int m = static_cast<int>(row_pair.size());
  if (m == 0) return {};
  std::vector<uint32_t> masks;
  for (int r = 0; r < m; ++r) masks.push_back(1u << row_pair[r]);  // the starting basis
  for (uint32_t mask = 1; mask < (1u << p); ++mask)
    if ((mask & ~active) == 0 && (free_join_[mask] & active) == 0 && (mask & (mask - 1)) != 0) masks.push_back(mask);
  CoverLp lp(m);
  lp.reserve(masks.size(), masks.size() * m);
  std::vector<int> rows;
  std::vector<double> values;
  for (uint32_t mask : masks) {
    rows.clear();
    values.clear();
    for (int r = 0; r < m; ++r)
      if ((mask >> row_pair[r]) & 1u) {
        rows.push_back(r);
        values.push_back(rate(mask, row_pair[r]) / demand[row_pair[r]]);
      }
    lp.add(rows, values);
  }
  lp.optimize(kMaxPivots);
  std::vector<std::pair<uint32_t, double>> out;
  for (const auto& [j, secs] : lp.solution()) out.emplace_back(masks[j], secs);
  std::sort(out.begin(), out.end(), [](const auto& u, const auto& v) {
    return u.second != v.second ? u.second > v.second : u.first < v.first;
  });
  return out;
}

// A swap pass evaluates about (members + 1) x (transfers + 1) sets, some five pricing rounds'
// work on 8 GPUs.  (On gen4-4sw-2skt Zipf 1.2 at 256 MB, started from the plan's phases,
// restarting the greedy from single transfers instead, a round each, left the stalled LP at
// 1.150x the lower bound; swap passes took it from 1.137x to 1.118x in 96 rounds.)
constexpr int kSwapPassRounds = 5;

std::vector<TimeShareColumn> time_share_search(const std::vector<std::vector<int>>& links,
                                               const std::vector<double>& link_bw, const std::vector<double>& eta,
                                               const std::vector<double>& demand,
                                               const std::vector<std::vector<int>>& start, int rounds) {
  const int m = static_cast<int>(demand.size());
  if (m == 0) return {};
  if (links.size() != demand.size() || eta.size() < 2)
    throw std::invalid_argument("varipath::time_share_search: need links per transfer and an eta table");
  for (size_t i = 0; i < links.size(); ++i) {
    if (!(demand[i] > 0.0)) throw std::invalid_argument("varipath::time_share_search: every demand must be > 0");
    if (links[i].empty()) throw std::invalid_argument("varipath::time_share_search: a transfer has no links");
    for (int l : links[i])
      if (l < 0 || static_cast<size_t>(l) >= link_bw.size())
        throw std::invalid_argument("varipath::time_share_search: link index out of range");
  }
  for (const auto& set : start)
    for (int i : set)
      if (i < 0 || i >= m) throw std::invalid_argument("varipath::time_share_search: start member out of range");
  SetRates setrates(links, link_bw, eta);
  CoverLp lp(m);
  std::vector<std::vector<int>> members;
  std::vector<std::vector<double>> member_rates;
  std::vector<double> r;
  auto add = [&](std::vector<int> set) {
    setrates.rates(set, &r);
    std::vector<double> values(set.size());
    for (size_t j = 0; j < set.size(); ++j) values[j] = r[j] / demand[set[j]];
    lp.add(set, values);
    members.push_back(std::move(set));
    member_rates.push_back(r);
  };
  for (int i = 0; i < m; ++i) add({i});
  for (const auto& set : start)
    if (set.size() > 1) add(set);
  const int kPivots = 64 * m;
  lp.optimize(kPivots);
  // Pricing: a configuration's value under the duals y is sum_i y_i rate_i / demand_i; one
  // above 1 improves the LP.  grow() builds a set from nothing by adding the transfer that
  // raises its value most, while one does.
  std::vector<char> in(m, 0);
  auto value_of = [&](const std::vector<int>& set, const std::vector<double>& y) {
    setrates.rates(set, &r);
    double v = 0.0;
    for (size_t j = 0; j < set.size(); ++j) v += y[set[j]] * r[j] / demand[set[j]];
    return v;
  };
  auto grow = [&](double* value) {
    const std::vector<double>& y = lp.duals();
    std::fill(in.begin(), in.end(), 0);
    std::vector<int> set;
    *value = 0.0;
    while (true) {
      int best = -1;
      double best_value = *value * (1.0 + 1e-9);
      for (int q = 0; q < m; ++q) {
        if (in[q] || y[q] <= 0.0) continue;
        set.push_back(q);
        const double v = value_of(set, y);
        set.pop_back();
        if (v > best_value) {
          best_value = v;
          best = q;
        }
      }
      if (best < 0) return set;
      set.push_back(best);
      in[best] = 1;
      *value = best_value;
    }
  };
  // One pass of swap local search on `set` under the current duals: the best of every
  // (drop one member or none, add one transfer with a positive price or none); false when no
  // move raises the value.
  std::vector<int> trial;
  auto swap_pass = [&](std::vector<int>* set, double* value) {
    const std::vector<double>& y = lp.duals();
    std::fill(in.begin(), in.end(), 0);
    for (int q : *set) in[q] = 1;
    double best = *value * (1.0 + 1e-9);
    int drop = -2, take = -2;
    const int size = static_cast<int>(set->size());
    for (int i = -1; i < size; ++i)
      for (int q = -1; q < m; ++q) {
        if ((i < 0 && q < 0) || (q >= 0 && (in[q] || y[q] <= 0.0))) continue;
        trial.clear();
        for (int k = 0; k < size; ++k)
          if (k != i) trial.push_back((*set)[k]);
        if (q >= 0) trial.push_back(q);
        if (trial.empty()) continue;
        const double v = value_of(trial, y);
        if (v > best) {
          best = v;
          drop = i;
          take = q;
        }
      }
    if (drop == -2) return false;
    if (drop >= 0) set->erase(set->begin() + drop);
    if (take >= 0) set->push_back(take);
    *value = best;
    return true;
  };
  constexpr double kImproves = 1.0 + 1e-6;  // a column whose dual value passes this enters the LP
  for (int budget = rounds; budget > 0; --budget) {
    double value = 0.0;
    std::vector<int> set = grow(&value);
    // The greedy stalls before the LP is optimal (the simplex's duals are degenerate: most rows
    // price at 0).  Then swap local search from its set: drop one member, add one transfer, or
    // both, the best move first, each pass paid as kSwapPassRounds rounds.
    for (; value <= kImproves && budget > kSwapPassRounds; budget -= kSwapPassRounds)
      if (!swap_pass(&set, &value)) break;
    if (value <= kImproves) break;
    std::sort(set.begin(), set.end());
    add(std::move(set));
    lp.optimize(kPivots);
  }
  std::vector<TimeShareColumn> out;
  for (const auto& [j, secs] : lp.solution()) out.push_back({members[j], member_rates[j], secs});
  std::sort(out.begin(), out.end(), [](const TimeShareColumn& a, const TimeShareColumn& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.members < b.members;
  });
  return out;
}

}  // namespace varipath
}  // namespace hoccl
