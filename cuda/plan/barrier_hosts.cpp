// barrier across hosts: a host barrier, the host leaders exchange one-byte messages (each
// leader sends to and receives from every other leader), a second host barrier. A leader's
// receives complete only after every other host's ranks reached the first barrier, and its
// host's ranks leave the second only after the leader has them all.
#include "plan/host_view.h"
#include "plan/plan.h"

namespace hoccl {

Plan planBarrierAcrossHosts(const PlanRequest& req) {
  const HostView hv(req);
  Plan p;
  p.algo = "barrier/hosts";
  p.steps.push_back(Step::barrier(Scope::Host));
  const int host = hv.host(req.rank);
  if (hv.leader(host) == req.rank && hv.hosts() > 1) {
    // One byte sent (the same byte to every leader), one byte per other leader received.
    const int64_t sent = p.reserveScratch(1);
    const int64_t received = p.reserveScratch(hv.hosts() - 1);
    std::vector<int> ids;
    int k = 0;
    for (int h = 0; h < hv.hosts(); ++h) {
      if (h == host) continue;
      ids.push_back(p.send(hv.leader(h), Loc::scratch(sent), 1));
      ids.push_back(p.recv(hv.leader(h), Loc::scratch(received + k++), 1));
    }
    p.waitAll(ids);
  }
  p.steps.push_back(Step::barrier(Scope::Host));
  return p;
}

}  // namespace hoccl
