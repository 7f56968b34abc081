// Collectives of the whole group as single plans across hosts: the host's group runs the plan
// (backend/across_hosts.cpp), this group keeps what it owns: argument agreement across hosts,
// issue order, the network tags, and turning a network failure into the error naming the host.
#include "backend/multihost/multihost_group.h"
#include "transport/net_transport.h"

namespace hoccl {

void MultiHostGroup::planned(const char* op, const std::function<void(ProcessGroupHOCCL&, int64_t)>& run) {
  checkUsable(op);
  try {
    run(*groups_.local, crossTag());
  } catch (const NetTransportError& e) {
    interHostFailed(op, allRanks_, e);
  }
  setAlgorithm(groups_.local->lastAlgorithm().c_str());
}

}  // namespace hoccl
