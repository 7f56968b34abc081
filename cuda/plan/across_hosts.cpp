// buildPlan's choice for groups whose ranks sit on several hosts (req.acrossHosts()): one case
// per op, each naming the builders of its family across hosts (the plan/ files whose names end in "hosts").
#include <stdexcept>
#include <string>

#include "plan/plan.h"

namespace hoccl {

Plan buildPlanAcrossHosts(const PlanRequest& req) {
  switch (req.kind) {
    // leaders when hosts are uneven, the payload is at most leaderMaxBytes or has fewer
    // elements than ranks per host; rails otherwise (docs/multihost.md).
    case OpKind::AllReduce: return reductionUsesRails(req) ? planAllReduceRails(req) : planAllReduceLeaders(req);
    case OpKind::Reduce: return reductionUsesRails(req) ? planReduceRails(req) : planReduceLeaders(req);
    case OpKind::ReduceScatter: return planReduceScatterAcrossHosts(req);
    case OpKind::Barrier: return planBarrierAcrossHosts(req);
    case OpKind::AllGather: return planAllGatherHosts(req, false);
    case OpKind::Gather: return planAllGatherHosts(req, true);
    case OpKind::Broadcast: return planBroadcastHosts(req);
    case OpKind::Scatter: return planScatterHosts(req);
    // direct until the cost model across hosts chooses between direct and rail.
    case OpKind::AllToAll: return planAllToAllHostsDirect(req);
    default: throw std::logic_error(std::string("hoccl: no plan across hosts for ") + opKindName(req.kind));
  }
}

}  // namespace hoccl
