// The plan builders: one algorithm family per file (plan/*.cpp), and buildPlan, the one rule
// that chooses among them from the request alone. The IR they build is common/plan_types.h.
#pragma once
#include "common/plan_types.h"

namespace hoccl {

Plan buildPlan(const PlanRequest& req);
// buildPlan for a group whose ranks sit on several hosts (plan/across_hosts.cpp).
Plan buildPlanAcrossHosts(const PlanRequest& req);
// buildPlan's rule for requests with onCopyEngine set (plan/copy_engine.cpp): all_gather,
// broadcast, all_to_all and all_reduce as the copy-engine executor runs them.
Plan buildCopyEnginePlan(const PlanRequest& req);
// readsPeersDirectly for those requests: the p2p path's direct-read plans.
bool copyEngineReadsInPlace(const PlanRequest& req);
// True when buildPlan(req) picks direct-read plans (peers' buffers read in place): the same on
// every rank, though one rank's own plan may read nobody (broadcast's root).
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

// Across hosts (steps inside a host name only that host's ranks; Send/Recv cross hosts).
// all_reduce and reduce: leaders or rails (plan/allreduce_hosts.cpp); rails when hosts are even,
// the payload is above leaderMaxBytes and has at least as many elements as ranks per host.
bool reductionUsesRails(const PlanRequest& req);
Plan planReductionAcrossHosts(const PlanRequest& req, bool rails, bool rootOnly, const char* algo);
Plan planAllReduceLeaders(const PlanRequest& req);
Plan planAllReduceRails(const PlanRequest& req);
Plan planReduceLeaders(const PlanRequest& req);
Plan planReduceRails(const PlanRequest& req);
Plan planReduceScatterAcrossHosts(const PlanRequest& req);
Plan planBarrierAcrossHosts(const PlanRequest& req);

// Data movement across hosts (req.hostOf names several hosts; Slot and peer steps stay on a
// host, Send/Recv cross): plan/allgather_hosts.cpp, broadcast_hosts.cpp, alltoall_hosts.cpp.
Plan planAllGatherHosts(const PlanRequest& req, bool onlyRoot);  // gather = only the root's outputs
// all_gather's two forms: blocks cross once per host and are handed on inside it (rail), or
// the host's blocks are gathered first and cross to every rank (host first: small blocks).
bool allGatherGoesHostFirst(const PlanRequest& req);
Plan planAllGatherRail(const PlanRequest& req);
Plan planAllGatherHostFirst(const PlanRequest& req);
Plan planBroadcastHosts(const PlanRequest& req);
Plan planScatterHosts(const PlanRequest& req);
// all_to_all across hosts; req.phases lists every pair's bytes (all phases concatenated).
Plan planAllToAllHostsDirect(const PlanRequest& req);  // cross-host blocks point to point
Plan planAllToAllHostsRail(const PlanRequest& req);    // relayed, one message per remote host
// req.phases as a matrix: [s * world + d] is the bytes s sends to d.
std::vector<int64_t> allToAllMatrix(const PlanRequest& req);

}  // namespace hoccl
