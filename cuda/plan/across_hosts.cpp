// buildPlan's choice for groups whose ranks sit on several hosts (req.acrossHosts()): one case
// per op, each naming the builders of its family across hosts (the plan/ files whose names end in "hosts").
#include <stdexcept>
#include <string>

#include "plan/plan.h"
#include "varipath/across_hosts.h"

namespace hoccl {
namespace {

// The form configuration forces, else VarioPath's choice for this split matrix and network.
bool allToAllRelays(const PlanRequest& req) {
  if (req.allToAllForm != AllToAllHostsForm::Auto) return req.allToAllForm == AllToAllHostsForm::Relay;
  return varipath::chooseAcrossHosts(req.hostOf, allToAllMatrix(req), req.netCosts) == AllToAllHostsForm::Relay;
}

}  // namespace

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
    case OpKind::AllToAll: return allToAllRelays(req) ? planAllToAllHostsRail(req) : planAllToAllHostsDirect(req);
    default: throw std::logic_error(std::string("hoccl: no plan across hosts for ") + opKindName(req.kind));
  }
}

}  // namespace hoccl
