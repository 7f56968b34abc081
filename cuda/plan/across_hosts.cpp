// The choice of plan across hosts (req.acrossHosts()): from fields of the request only, so every
// rank of every host picks the same builder.
#include <stdexcept>
#include <string>

#include "plan/plan.h"

namespace hoccl {

Plan buildPlanAcrossHosts(const PlanRequest& req) {
  switch (req.kind) {
    case OpKind::AllGather: return planAllGatherHosts(req, false);
    case OpKind::Gather: return planAllGatherHosts(req, true);
    case OpKind::Broadcast: return planBroadcastHosts(req);
    case OpKind::Scatter: return planScatterHosts(req);
    // The cheaper of direct and rail by a cost model across hosts comes next; direct until then.
    case OpKind::AllToAll: return planAllToAllHostsDirect(req);
    default:
      throw std::logic_error(std::string("hoccl: no plan across hosts for ") + opKindName(req.kind));
  }
}

}  // namespace hoccl
