// all_to_all across hosts as one plan across hosts (the entry points and their checks are the
// group's, backend/alltoall.cpp). With the split check (the default) or a forced rail form, the
// plan's form is picked by VarioPath's cost model from the gathered split matrix (planned.cpp);
// without the check, the direct form from each rank's own splits
// (ProcessGroupHOCCL::planFromOwnSplits).
#include "backend/multihost/host_span.h"

namespace hoccl {

// With the check (or the rail form, which relays by the whole matrix) every rank gathers the split
// matrix first, one message round before the data. Without it the direct form needs only this
// rank's own splits and its host's, traded inside the host: no round across hosts before the data
// (4 KB-1 MB on 2x2: as fast as gloo, where the split exchange costs 1.3-1.5x: docs/multihost.md).
void HostSpan::alltoallBlocks(const ProcessGroupHOCCL::AllToAllBlocks& blocks, const char* op) {
  if (checkAcrossHosts_ || alltoallChoice_ == AllToAllHostsForm::Relay)
    return alltoallPlanned(blocks, op);
  ProcessGroupHOCCL::HostsOp o{op, OpKind::AllToAll};
  o.in = blocks.in;
  o.out = blocks.out;
  o.sendBytes = blocks.sendBytes;
  o.recvBytes = blocks.recvBytes;
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
  setAlgorithm("multihost_direct");
  std::lock_guard<std::mutex> lock(stateMutex_);
  lastPhases_.clear();
}

}  // namespace hoccl
