// The plan builders: one algorithm family per file (plan/*.cpp), and buildPlan, the one rule
// that chooses among them from the request alone. The IR they build is common/plan_types.h.
#pragma once
#include "common/plan_types.h"

namespace hoccl {

Plan buildPlan(const PlanRequest& req);
// True when buildPlan(req) picks a direct-read plan (peers' buffers read in place).
bool readsPeersDirectly(const PlanRequest& req);
// all_reduce past allReduceDirectReadMaxBytes: the plan depends on whether every rank's tensor
// is shared, which ranks learn from a first barrier that publishes addresses and regions.
bool allReduceChoosesAfterPublishing(const PlanRequest& req);

// Plan builders, one algorithm family per file.
Plan planAllReduceOneShot(const PlanRequest& req);
Plan planAllReduceRsAg(const PlanRequest& req);
Plan planAllGather(const PlanRequest& req, bool onlyRoot);  // gather = allgather to root only
Plan planBroadcast(const PlanRequest& req);
Plan planScatter(const PlanRequest& req);
Plan planReduce(const PlanRequest& req);
Plan planStagedReduce(const PlanRequest& req, bool rootOnly, const char* algo);
Plan planReduceScatter(const PlanRequest& req);
Plan planAllToAll(const PlanRequest& req);
// Single-copy variants: every rank reads what it needs straight from its peers' buffers.
Plan planDirectRead(const PlanRequest& req);
Plan planAllToAllDirectRead(const PlanRequest& req);

}  // namespace hoccl
