#include "varipath_timeshare.h"

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
// demand, x_j in seconds) by a revised simplex with a dense B^-1 (rows: the demanded pairs).
// The starting basis is feasible: the first `rows` columns, every row's transfer alone
// (x = demand / rate).  Entering column: the most negative reduced cost (Dantzig), or after a
// degenerate pivot the first negative one (Bland, which cannot cycle), columns in the order
// added and then the slacks; leaving row: the smallest ratio, first basis position on ties.
// Columns may be added between optimize() calls; the basis is kept (warm start).
class CoverLp {
 public:
  explicit CoverLp(int rows) : m_(rows), basis_(rows), binv_(static_cast<size_t>(rows) * rows, 0.0), xb_(rows) {}

  // Column j = add(); the first `rows` columns must be the rows' own singletons (the basis).
  int add(std::vector<double> column) {
    cols_.push_back(std::move(column));
    const int j = static_cast<int>(cols_.size()) - 1;
    if (j < m_) {
      basis_[j] = j;
      binv_[static_cast<size_t>(j) * m_ + j] = 1.0 / cols_[j][j];
      xb_[j] = binv_[static_cast<size_t>(j) * m_ + j];
    }
    return j;
  }

  std::vector<double> duals() const {
    std::vector<double> y(m_, 0.0);
    for (int k = 0; k < m_; ++k)
      if (basis_[k] >= 0)
        for (int r = 0; r < m_; ++r) y[r] += binv_[static_cast<size_t>(k) * m_ + r];
    return y;
  }

  void optimize(int max_pivots) {
    bool bland = false;
    std::vector<double> d(m_), col(m_);
    for (int pivot = 0; pivot < max_pivots; ++pivot) {
      const std::vector<double> y = duals();
      int enter = kNone;
      double best = -1e-9;
      for (size_t j = 0; j < cols_.size() && !(bland && enter != kNone); ++j) {
        double dot = 0.0;
        for (int r = 0; r < m_; ++r) dot += y[r] * cols_[j][r];
        if (1.0 - dot < best) {
          best = 1.0 - dot;
          enter = static_cast<int>(j);
        }
      }
      for (int r = 0; r < m_ && !(bland && enter != kNone); ++r)
        if (y[r] < best) {
          best = y[r];
          enter = -(r + 1);
        }
      if (enter == kNone) return;
      for (int r = 0; r < m_; ++r) col[r] = enter >= 0 ? cols_[enter][r] : (r == -enter - 1 ? -1.0 : 0.0);
      for (int k = 0; k < m_; ++k) {
        double sum = 0.0;
        for (int r = 0; r < m_; ++r) sum += binv_[static_cast<size_t>(k) * m_ + r] * col[r];
        d[k] = sum;
      }
      int leave = -1;
      double theta = 0.0;
      for (int k = 0; k < m_; ++k) {
        if (d[k] <= 1e-12) continue;
        const double t = xb_[k] / d[k];
        if (leave < 0 || t < theta) {
          leave = k;
          theta = t;
        }
      }
      if (leave < 0) return;
      bland = theta <= 0.0;
      for (int k = 0; k < m_; ++k) xb_[k] -= theta * d[k];
      xb_[leave] = theta;
      double* lr = binv_.data() + static_cast<size_t>(leave) * m_;
      const double piv = d[leave];
      for (int r = 0; r < m_; ++r) lr[r] /= piv;
      for (int k = 0; k < m_; ++k) {
        if (k == leave || d[k] == 0.0) continue;
        double* kr = binv_.data() + static_cast<size_t>(k) * m_;
        for (int r = 0; r < m_; ++r) kr[r] -= d[k] * lr[r];
      }
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
  int m_;
  std::vector<std::vector<double>> cols_;
  std::vector<int> basis_;  // column index, or -(r + 1) for row r's slack
  std::vector<double> binv_, xb_;
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
  for (uint32_t mask : masks) {
    std::vector<double> column(m);
    for (int r = 0; r < m; ++r) column[r] = rate(mask, row_pair[r]) / demand[row_pair[r]];
    lp.add(std::move(column));
  }
  lp.optimize(kMaxPivots);
  std::vector<std::pair<uint32_t, double>> out;
  for (const auto& [j, secs] : lp.solution()) out.emplace_back(masks[j], secs);
  std::sort(out.begin(), out.end(), [](const auto& u, const auto& v) {
    return u.second != v.second ? u.second > v.second : u.first < v.first;
  });
  return out;
}

std::vector<TimeShareColumn> time_share_search(const std::vector<std::vector<int>>& links,
                                               const std::vector<double>& link_bw, const std::vector<double>& eta,
                                               const std::vector<double>& demand,
                                               const std::vector<std::vector<int>>& start, int rounds) {
  const int m = static_cast<int>(demand.size());
  if (m == 0) return {};
  if (links.size() != demand.size() || eta.size() < 2)
    throw std::invalid_argument("varipath::time_share_search: need links per transfer and an eta table");
  SetRates setrates(links, link_bw, eta);
  CoverLp lp(m);
  std::vector<std::vector<int>> members;
  std::vector<std::vector<double>> member_rates;
  std::vector<double> r;
  auto add = [&](std::vector<int> set) {
    setrates.rates(set, &r);
    std::vector<double> column(m, 0.0);
    for (size_t j = 0; j < set.size(); ++j) column[set[j]] = r[j] / demand[set[j]];
    lp.add(std::move(column));
    members.push_back(std::move(set));
    member_rates.push_back(r);
  };
  for (int i = 0; i < m; ++i) add({i});
  for (const auto& set : start)
    if (set.size() > 1) add(set);
  const int kPivots = 64 * m;
  lp.optimize(kPivots);
  std::vector<char> in(m, 0);
  for (int round = 0; round < rounds; ++round) {
    const std::vector<double> y = lp.duals();
    std::vector<int> set;
    double value = 0.0;
    std::fill(in.begin(), in.end(), 0);
    while (true) {  // greedy: the transfer that raises sum_i y_i rate_i / demand_i most
      int best = -1;
      double best_value = value * (1.0 + 1e-9);
      for (int q = 0; q < m; ++q) {
        if (in[q] || y[q] <= 0.0) continue;
        set.push_back(q);
        setrates.rates(set, &r);
        double v = 0.0;
        for (size_t j = 0; j < set.size(); ++j) v += y[set[j]] * r[j] / demand[set[j]];
        set.pop_back();
        if (v > best_value) {
          best_value = v;
          best = q;
        }
      }
      if (best < 0) break;
      set.push_back(best);
      in[best] = 1;
      value = best_value;
    }
    if (value <= 1.0 + 1e-6) break;  // the greedy finds no configuration that improves the LP
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
