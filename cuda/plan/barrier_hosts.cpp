// barrier across hosts: a host barrier, the host leaders exchange empty messages (each leader
// sends to and receives from every other leader), a second host barrier. A leader's receives
// complete only after every other host's ranks reached the first barrier, and its host's ranks
// leave the second only after the leader has them all. The messages carry no bytes (a barrier has
// no data a byte could come from); they point into one reserved byte of Scratch so that the
// engine gets a valid address.
#include "common/host_view.h"
#include "plan/plan.h"

namespace hoccl {

Plan planBarrierAcrossHosts(const PlanRequest& req) {
  const HostView hv(req);
  Plan p;
  p.algo = "barrier/hosts";
  p.steps.push_back(Step::barrier(Scope::Host));
  const int host = hv.host(req.rank);
  if (hv.leader(host) == req.rank && hv.hosts() > 1) {
    const Loc nothing = Loc::scratch(p.reserveScratch(1));
    std::vector<int> ids;
    for (int h = 0; h < hv.hosts(); ++h) {
      if (h == host) continue;
      ids.push_back(p.send(hv.leader(h), nothing, 0));
      ids.push_back(p.recv(hv.leader(h), nothing, 0));
    }
    p.waitAll(ids);
  }
  p.steps.push_back(Step::barrier(Scope::Host));
  return p;
}

}  // namespace hoccl
