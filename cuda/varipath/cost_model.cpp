// The cost model (see cost_model.h): eta tables, exact phase costs, fused-run costs.  The event
// model for phases with shared links is in event_model.cpp.
#include "varipath/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace hoccl {
namespace varipath {

void ModelTables::set(const CostModel& model, int n) {
  if (model.eta_beta < 0.0 || model.eta_min <= 0.0 || model.eta_min > 1.0 || model.copy_engines < 0)
    throw std::invalid_argument("varipath::Scheduler::set_cost_model: need eta_beta >= 0, 0 < eta_min <= 1, copy_engines >= 0");
  static_cast<CostModel&>(*this) = model;
  eta_table.assign(static_cast<size_t>(n) * 4 + 2, 1.0);
  for (size_t k = 2; k < eta_table.size(); ++k)
    eta_table[k] = std::max(eta_min, 1.0 - eta_beta * std::log2(static_cast<double>(k)));
  inv_eta_table.resize(eta_table.size());
  for (size_t k = 0; k < eta_table.size(); ++k) inv_eta_table[k] = 1.0 / eta_table[k];
  // log2 grows with k, so once the table's last entry is at the floor eta_min every larger k is
  // too (a link shared by more flows than the table covers then costs no log2 call).
  const double last = static_cast<double>(eta_table.size() - 1);
  eta_floored = eta_beta > 0.0 && 1.0 - eta_beta * std::log2(last) <= eta_min;
}

double ModelTables::slow_eta(int k) const {
  return std::max(eta_min, 1.0 - eta_beta * std::log2(static_cast<double>(k)));
}

// eta(0..flows) as a table (time sharing: a link carries at most every transfer at once).
std::vector<double> ModelTables::eta_upto(int flows) const {
  std::vector<double> table(static_cast<size_t>(flows) + 1, 1.0);
  for (size_t k = 2; k < table.size(); ++k) table[k] = eta(static_cast<int>(k));
  return table;
}

LinkScratch Costing::scratch() const {
  return LinkScratch(net_.link_bw.size(), net_.pair_links.size(), static_cast<size_t>(net_.n));
}

void Costing::add_transfer(LinkScratch* ls, int pair, int64_t bytes) const {
  int& at = ls->slot[pair];
  const bool fresh = at < 0;
  if (fresh) {
    at = static_cast<int>(ls->flow_pair.size());
    ls->flow_pair.push_back(pair);
    ls->flow_bytes.push_back(0.0);
  }
  ls->flow_bytes[at] += static_cast<double>(bytes);
  for (int l : net_.links_of(pair)) {
    if (ls->flows[l] == 0 && ls->load[l] == 0.0) ls->touched.push_back(l);
    ls->load[l] += static_cast<double>(bytes);
    if (fresh) ls->flows[l] += 1;
  }
}

// Drains the scratch: returns the phase's start latency plus its data time.  When every link
// carries at most one flow (and no source queues), flows run alone and the most loaded link's
// time is exact under every model; so it is under `fluid`, where max-min sharing keeps the
// bottleneck link busy.  Otherwise the event model above estimates the phase.
double Costing::drain_cost(LinkScratch* ls, double limit) const {
  if (ls->touched.empty()) return 0.0;
  double worst = 0.0;
  bool shared = false;
  for (int l : ls->touched) {
    worst = std::max(worst, ls->load[l] / net_.link_bw[l]);
    shared = shared || ls->flows[l] > 1;
  }
  if (model_.copy_engines > 0 && !shared) {  // the default link model has one send port per GPU,
    for (int p : ls->flow_pair) shared = shared || ++ls->per_source[net_.pair_src[p]] > model_.copy_engines;
    for (int p : ls->flow_pair) ls->per_source[net_.pair_src[p]] = 0;  // but a custom one may not
  }
  const bool sharing_costs = model_.eta_beta > 0.0 || model_.copy_engines > 0;
  const double data = shared && sharing_costs ? event_time(ls, limit - net_.latency_s) : worst;
  reset_scratch(ls);
  return net_.latency_s + data;
}

void Costing::reset_scratch(LinkScratch* ls) const {
  for (int l : ls->touched) {
    ls->load[l] = 0.0;
    ls->flows[l] = 0;
  }
  ls->touched.clear();
  for (int p : ls->flow_pair) ls->slot[p] = -1;
  ls->flow_pair.clear();
  ls->flow_bytes.clear();
}

double Costing::phase_cost(const Phase& phase) const {
  LinkScratch ls = scratch();
  for (const Transfer& t : phase) add_transfer(&ls, t.src * net_.n + t.dst, t.bytes);
  return drain_cost(&ls, std::numeric_limits<double>::infinity());
}

double Costing::estimate(const std::vector<Phase>& phases) const {
  double total = 0.0;
  for (const Phase& ph : phases) total += phase_cost(ph);
  return total;
}

double Costing::merged_cost(const std::vector<std::vector<int>>& chans,
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
      rest = net_.latency_s * static_cast<double>(groups - g - 1);
    }
    const size_t stop = std::min(chans.size(), start + static_cast<size_t>(merge));
    for (size_t i = start; i < stop; ++i)
      for (size_t k = 0; k < chans[i].size(); ++k) add_transfer(ls, chans[i][k], bytes[i][k]);
    // The event model stops once this group's share of `limit` is spent; then the sum below
    // reaches `limit` too.
    total += drain_cost(ls, limit - total - rest);
    if (total + rest >= limit) return std::numeric_limits<double>::infinity();
  }
  return total;
}

}  // namespace varipath
}  // namespace hoccl
