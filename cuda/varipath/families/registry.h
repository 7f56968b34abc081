// VarioPath's plan families.  A family turns a demand into one or more decompositions (channel
// phases with bytes) that the search then costs, fused and unfused, against every other
// family's.  Each family lives in one file of this folder and has one row in the table of
// registry.cpp:
//
//   name           what plan_info() reports as "candidate"
//   code           PlanInfo::family (scheduler.h)
//   candidate_bit  the Scheduler::set_candidates() bit that enables it
//   bounded_first  built before the others, each decomposition bounded as it is built: an exact
//                  plan within kGoodEnough of the plan floor ends the search there
//   build          appends its decompositions to PlanSearch::decs when its own conditions hold
//                  (sizes, ranks, model); returns true when it ended the search (end_with())
//
// Builders run in table order (the order is part of the plan: ties between equal bounds go to
// the earlier decomposition).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "varipath/cost_model.h"
#include "varipath/decomposition.h"
#include "varipath/network.h"
#include "varipath/search.h"
#include "varipath/timeshare.h"

namespace hoccl {
namespace varipath {

struct Family {
  const char* name;
  int code;
  int candidate_bit;
  bool bounded_first;
  bool (*build)(PlanSearch* s);
};

// The table, in build order.
const std::vector<Family>& families();
// Every family's candidate bit.
int family_bits();

// The builders (one file each).
bool build_link_greedy(PlanSearch* s);        // link_greedy.cpp (with backfilled variants)
bool build_split_peer(PlanSearch* s);         // split_peer.cpp
bool build_catalog_channels(PlanSearch* s);   // catalog_channels.cpp
bool build_peer_rounds(PlanSearch* s);        // peer_rounds.cpp
bool build_direct(PlanSearch* s);             // direct.cpp
bool build_host_rounds(PlanSearch* s);        // host_rounds.cpp
bool build_time_share(PlanSearch* s);         // time_share.cpp

// Pieces other units use.
Decomposition direct_decomposition(const Network& net, const std::vector<int64_t>& demand);  // direct.cpp
// Whether the link-greedy pass runs (its work budget past kMaxSimulatedRanks ranks); split
// peer rounds stand in for it otherwise.
bool link_greedy_in_budget(const PlanSearch& s);  // link_greedy.cpp
// Moves whole transfers of short phases into longer ones that provably still end on time.
bool backfill(const Network& net, const ModelTables& model, Decomposition* dec);  // backfill.cpp
// The time-sharing configuration table for small groups under contention, or null.
std::shared_ptr<const TimeShareTable> time_share_table(const Network& net, const ModelTables& model);  // time_share.cpp

}  // namespace varipath
}  // namespace hoccl
