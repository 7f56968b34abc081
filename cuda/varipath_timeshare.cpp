#include "varipath_timeshare.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace hoccl {
namespace varipath {

namespace {

// Max-min-fair rates of the members of one configuration by progressive filling: the link with
// the smallest fair share of its capacity (bandwidth x eta(flows on it)) fixes the rate of its
// unfrozen flows, which then come off their other links; first link in index order on ties.
void max_min_rates(uint32_t mask, int pairs, const std::vector<std::vector<int>>& links,
                   const std::vector<double>& link_bw, const std::vector<double>& eta, double* rate) {
  const size_t nl = link_bw.size();
  std::vector<int> count(nl, 0), unfrozen(nl, 0);
  std::vector<double> cap(nl, 0.0);
  int open = 0;
  for (int i = 0; i < pairs; ++i) {
    rate[i] = (mask >> i) & 1u ? -1.0 : 0.0;
    if (!((mask >> i) & 1u)) continue;
    ++open;
    for (int l : links[i]) count[l] += 1;
  }
  for (size_t l = 0; l < nl; ++l) {
    if (count[l] == 0) continue;
    const size_t k = std::min(static_cast<size_t>(count[l]), eta.size() - 1);
    cap[l] = link_bw[l] * (count[l] > 1 ? eta[k] : 1.0);
    unfrozen[l] = count[l];
  }
  while (open > 0) {
    int neck = -1;
    double low = 0.0;
    for (size_t l = 0; l < nl; ++l) {
      if (unfrozen[l] == 0) continue;
      const double share = cap[l] / unfrozen[l];
      if (neck < 0 || share < low) {
        neck = static_cast<int>(l);
        low = share;
      }
    }
    const double level = std::max(low, 0.0);
    for (int i = 0; i < pairs; ++i) {
      if (rate[i] >= 0.0) continue;
      if (std::find(links[i].begin(), links[i].end(), neck) == links[i].end()) continue;
      rate[i] = level;
      --open;
      for (int l : links[i]) {
        cap[l] -= level;
        unfrozen[l] -= 1;
      }
    }
  }
}

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
  std::vector<double> r(p);
  for (uint32_t mask = 1; mask < configs; ++mask) {
    max_min_rates(mask, p, links, link_bw, eta, r.data());
    for (int i = 0; i < p; ++i) rates_[(static_cast<size_t>(i) << p) + mask] = r[i];
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

// Revised simplex on  min sum x_c  s.t.  sum_c (rate_ic / demand_i) x_c - s_i = 1,  x, s >= 0,
// over the rows i with demand and the configurations made of those rows only (x_c in seconds).
// The starting basis is feasible: every row's transfer alone (x = demand / rate).  Pricing is
// one pass per row over the whole pair-major rate table; entering column: the most negative
// reduced cost (Dantzig), or after a degenerate pivot the first negative one (Bland, which
// cannot cycle); leaving row: the smallest ratio, first basis position on ties.  Dense B^-1: at
// most 12 rows.
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
  // Candidate configurations: made of rows only, and none that a row could join for free.
  std::vector<uint32_t> cand;
  for (uint32_t mask = 1; mask < (1u << p); ++mask)
    if ((mask & ~active) == 0 && (free_join_[mask] & active) == 0) cand.push_back(mask);
  const size_t configs = cand.size();
  std::vector<double> cand_rate(configs * static_cast<size_t>(m));  // row-major: [r * configs + k]
  for (int r = 0; r < m; ++r)
    for (size_t k = 0; k < configs; ++k) cand_rate[r * configs + k] = rate(cand[k], row_pair[r]);
  auto entry = [&](uint32_t mask, int r) { return rate(mask, row_pair[r]) / demand[row_pair[r]]; };
  // Basis variables: a configuration mask (>= 1), or -(r + 1) for the slack of row r.
  std::vector<int64_t> basis(m);
  std::vector<double> binv(static_cast<size_t>(m) * m, 0.0), xb(m);
  for (int r = 0; r < m; ++r) {
    const uint32_t alone = 1u << row_pair[r];
    basis[r] = alone;
    binv[static_cast<size_t>(r) * m + r] = 1.0 / entry(alone, r);
    xb[r] = binv[static_cast<size_t>(r) * m + r];
  }
  std::vector<double> y(m), d(m), col(m), reduced(configs);
  bool bland = false;
  for (int pivot = 0; pivot < kMaxPivots; ++pivot) {
    // Duals y = c_B B^-1 (cost 1 for configurations, 0 for slacks); reduced costs of every
    // configuration, 1 - sum_r y_r rate_rc / demand_r, one pass per row.
    std::fill(y.begin(), y.end(), 0.0);
    for (int k = 0; k < m; ++k)
      if (basis[k] > 0)
        for (int r = 0; r < m; ++r) y[r] += binv[static_cast<size_t>(k) * m + r];
    std::fill(reduced.begin(), reduced.end(), 1.0);
    for (int r = 0; r < m; ++r) {
      const double w = y[r] / demand[row_pair[r]];
      const double* rates = cand_rate.data() + r * configs;
      for (size_t k = 0; k < configs; ++k) reduced[k] -= w * rates[k];
    }
    int64_t enter = 0;
    double best = -1e-9;
    for (size_t k = 0; k < configs; ++k) {
      if (!(reduced[k] < best)) continue;
      best = reduced[k];
      enter = cand[k];
      if (bland) break;
    }
    for (int r = 0; r < m && !(bland && enter != 0); ++r)
      if (y[r] < best) {  // slack column -e_r: reduced cost y_r
        best = y[r];
        enter = -(r + 1);
        if (bland) break;
      }
    if (enter == 0) break;  // optimal
    for (int r = 0; r < m; ++r)
      col[r] = enter > 0 ? entry(static_cast<uint32_t>(enter), r) : (r == -enter - 1 ? -1.0 : 0.0);
    for (int k = 0; k < m; ++k) {
      double s = 0.0;
      for (int r = 0; r < m; ++r) s += binv[static_cast<size_t>(k) * m + r] * col[r];
      d[k] = s;
    }
    int leave = -1;
    double theta = 0.0;
    for (int k = 0; k < m; ++k) {
      if (d[k] <= 1e-12) continue;
      const double t = xb[k] / d[k];
      if (leave < 0 || t < theta) {
        leave = k;
        theta = t;
      }
    }
    if (leave < 0) break;  // unbounded cannot happen (cost >= 0); stop with the current basis
    bland = theta <= 0.0;
    for (int k = 0; k < m; ++k) xb[k] -= theta * d[k];
    xb[leave] = theta;
    const double piv = d[leave];
    double* lr = binv.data() + static_cast<size_t>(leave) * m;
    for (int r = 0; r < m; ++r) lr[r] /= piv;
    for (int k = 0; k < m; ++k) {
      if (k == leave || d[k] == 0.0) continue;
      double* kr = binv.data() + static_cast<size_t>(k) * m;
      for (int r = 0; r < m; ++r) kr[r] -= d[k] * lr[r];
    }
    basis[leave] = enter;
  }
  std::vector<std::pair<uint32_t, double>> out;
  for (int k = 0; k < m; ++k)
    if (basis[k] > 0 && xb[k] > 0.0) out.emplace_back(static_cast<uint32_t>(basis[k]), xb[k]);
  std::sort(out.begin(), out.end(), [](const auto& u, const auto& v) {
    return u.second != v.second ? u.second > v.second : u.first < v.first;
  });
  return out;
}

}  // namespace varipath
}  // namespace hoccl
