// One plan() call: the demand's analysis, the decompositions the plan families build from it
// (families/registry.h), and the choice among them (candidates.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "varipath/bounds.h"
#include "varipath/cost_model.h"
#include "varipath/decomposition.h"
#include "varipath/network.h"
#include "varipath/phase.h"
#include "varipath/scheduler.h"
#include "varipath/timeshare.h"

namespace hoccl {
namespace varipath {

// What a family's builder reads, and where it puts its decompositions.
struct PlanSearch {
  PlanSearch(const Network& net, const ModelTables& model, const TimeShareTable* timeshare, int candidates,
             const std::vector<int64_t>& demand, int64_t top);

  // Bounds `dec` unfused (stored on it) and returns true when it is exact and within
  // kGoodEnough of the plan floor: then the search ends with it.
  bool bound_unfused(Decomposition* dec);
  // Ends the search with `dec`, unfused; returns true (what a builder returns then).
  bool end_with(Decomposition dec);

  const Network& net;
  const ModelTables& model;
  const TimeShareTable* timeshare;  // the time-sharing table, when one is built
  int candidates;                   // set_candidates() mask
  Costing costing;
  Bounds bounds;
  const std::vector<int64_t>& demand;
  int64_t top;                 // the largest transfer
  double bound_s = 0.0;        // the busiest link's time
  std::vector<double> load;    // bytes per link
  std::vector<double> weight;  // pair_urgency()
  HotLink hot;
  double floor_s = 0.0;        // Bounds::plan_floor(): no plan costs less
  size_t active_pairs = 0;     // pairs with demand
  LinkScratch ls;
  std::vector<Decomposition> decs;  // built so far, in family order
  double best_exact = std::numeric_limits<double>::infinity();  // the best exact unfused bound
  std::optional<Decomposition> ended;  // end_with()'s decomposition
};

// The plan for `demand` (validated), filling *info when given.
std::vector<Phase> plan_search(const Network& net, const ModelTables& model, const TimeShareTable* timeshare,
                               int candidates, const std::vector<int64_t>& demand, PlanInfo* info);

// The cheapest candidate among every (decomposition, merge factor) of s->decs (candidates.cpp).
std::vector<Phase> choose_plan(PlanSearch* s, PlanInfo* info);

}  // namespace varipath
}  // namespace hoccl
