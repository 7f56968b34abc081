// One plan() call (see search.h): the demand's analysis, the shortcuts where one plan provably
// costs the plan floor, and the families' decompositions in registry order.
#include "varipath/search.h"

#include <algorithm>
#include <utility>

#include "varipath/families/registry.h"
#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

PlanSearch::PlanSearch(const Network& net_in, const ModelTables& model_in, const TimeShareTable* table,
                       int candidate_mask, const std::vector<int64_t>& demand_in, int64_t largest)
    : net(net_in),
      model(model_in),
      timeshare(table),
      candidates(candidate_mask),
      costing(net_in, model_in),
      bounds(net_in, model_in),
      demand(demand_in),
      top(largest),
      ls(costing.scratch()) {
  weight = pair_urgency(net, demand, &bound_s, &load);
  floor_s = bounds.plan_floor(demand, load, bound_s, &hot);
  for (size_t p = 0; p < demand.size(); ++p) active_pairs += net.pair_src[p] != net.pair_dst[p] && demand[p] > 0;
}

bool PlanSearch::bound_unfused(Decomposition* dec) {
  bool exact = true;
  uint64_t sig = 0;
  const double cost = bounds.merged_bound(*dec, 1, &ls, &exact, &sig);
  dec->bound1 = cost;
  dec->exact1 = exact;
  dec->sig1 = sig;
  dec->have1 = true;
  if (exact) best_exact = std::min(best_exact, cost);
  return exact && cost <= (1.0 + kGoodEnough) * floor_s;
}

bool PlanSearch::end_with(Decomposition dec) {
  ended = std::move(dec);
  return true;
}

namespace {

std::vector<Phase> unfused_plan(const Network& net, const Decomposition& dec, PlanInfo* info) {
  if (info)
    *info = PlanInfo{dec.bound1, static_cast<int>(dec.pairs.size()), 1, static_cast<double>(dec.quantum), 0,
                     dec.family, 1, 0, dec.backfilled};
  return materialize(net, dec.pairs, dec.bytes, 1);
}

}  // namespace

std::vector<Phase> plan_search(const Network& net, const ModelTables& model, const TimeShareTable* timeshare,
                               int candidates, const std::vector<int64_t>& demand, PlanInfo* info) {
  int64_t top = 0;
  for (size_t p = 0; p < demand.size(); ++p)
    if (net.pair_src[p] != net.pair_dst[p]) top = std::max(top, demand[p]);
  if (info) *info = PlanInfo{};
  if (top == 0) return {};
  PlanSearch s(net, model, timeshare, candidates, demand, top);
  const bool plain_model = model.eta_beta <= 0.0 && model.copy_engines == 0;
  // Without eta or copy-engine queues one phase with the whole demand costs the plan floor (see
  // below); an unfused link-greedy or split plan has at least as many phases as the hot link has
  // pairs, so when their start latencies alone exceed kGoodEnough of the floor none of those
  // plans can be taken early, and the one-phase plan is returned without building them.
  if (plain_model && (candidates & kDirect) &&
      static_cast<double>(s.hot.pairs) * net.latency_s + s.bound_s > (1.0 + kGoodEnough) * s.floor_s) {
    Decomposition dec = direct_decomposition(net, demand);
    if (info) *info = PlanInfo{s.floor_s, 1, 1, 0.0, 0, dec.family, 1, 0};
    return materialize(net, dec.pairs, dec.bytes, 1);
  }
  // No plan costs less than the plan floor: an exact plan of the families bounded first within
  // kGoodEnough of it is taken without building the others.
  for (const Family& f : families())
    if (f.bounded_first && (candidates & f.candidate_bit) && f.build(&s)) return unfused_plan(net, *s.ended, info);
  // Without eta derating or copy-engine queues the cost model charges a phase its start latency
  // plus its busiest link's time, so the whole demand in one phase costs exactly the plan floor
  // and no other candidate can beat it: the first link-greedy decomposition fused into one.
  if (!s.decs.empty() && plain_model) {
    const Decomposition& dec = s.decs.front();
    const int all = static_cast<int>(dec.pairs.size());
    if (info) *info = PlanInfo{s.floor_s, all, all, static_cast<double>(dec.quantum), 0, dec.family, 1, 0};
    return materialize(net, dec.pairs, dec.bytes, all);
  }
  for (const Family& f : families())
    if (!f.bounded_first && (candidates & f.candidate_bit)) f.build(&s);
  return choose_plan(&s, info);
}

}  // namespace varipath
}  // namespace hoccl
