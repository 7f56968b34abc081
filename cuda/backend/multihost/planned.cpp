// Collectives of the whole group as single plans across hosts: the group runs the plan
// (backend/across_hosts.cpp), this object keeps what it owns: argument agreement across hosts,
// issue order, the network tags, and turning a network failure into the error naming the host.
#include "backend/multihost/host_span.h"
#include "backend/tensor_args.h"
#include "transport/net_transport.h"

namespace hoccl {

void HostSpan::planned(const char* op, const std::function<void(ProcessGroupHOCCL&, int64_t)>& run) {
  checkUsable(op);
  try {
    run(pg_, crossTag());
  } catch (const NetTransportError& e) {
    interHostFailed(op, allRanks_, e);
  }
  setAlgorithm(pg_.planAlgorithm().c_str());
}

// Every rank's send and expected-receive bytes, gathered by an all_gather plan: the all_to_all
// plans of every rank follow every pair through its host, so each needs the whole matrix.
SplitMatrix HostSpan::exchangeSplitsPlanned(const char* op, const std::vector<int64_t>& sendBytes,
                                                  const std::vector<int64_t>& recvBytes) {
  const int64_t width = 2 * size_;
  std::vector<int64_t> own = SplitMatrix::row(sendBytes, recvBytes);
  std::vector<int64_t> rows(static_cast<size_t>(size_) * width);
  ProcessGroupHOCCL::HostsOp o{op, OpKind::AllGather};
  o.in = {reinterpret_cast<char*>(own.data())};
  for (int r = 0; r < size_; ++r) o.out.push_back(reinterpret_cast<char*>(rows.data() + r * width));
  o.bytes = o.numel = width * static_cast<int64_t>(sizeof(int64_t));
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
  std::vector<const int64_t*> rowOf(size_);
  for (int r = 0; r < size_; ++r) rowOf[r] = rows.data() + r * width;
  return SplitMatrix::fromRows(rowOf);
}

void HostSpan::alltoallPlanned(const ProcessGroupHOCCL::AllToAllBlocks& blocks, const char* op) {
  const SplitMatrix m = exchangeSplitsPlanned(op, blocks.sendBytes, blocks.recvBytes);
  if (checkAcrossHosts_) checkSplits(op, m);
  ProcessGroupHOCCL::HostsOp o{op, OpKind::AllToAll};
  TransferPhase pairs;
  for (int s = 0; s < size_; ++s)
    for (int d = 0; d < size_; ++d) pairs.push_back({s, d, m.at(s, d)});
  o.phases = {std::move(pairs)};
  o.in = blocks.in;
  o.out = blocks.out;
  // Every rank's plan choices must agree: size the op by the whole exchange, as on one host.
  for (int64_t b : m.bytes) o.bytes += b;
  o.bytes /= size_;
  o.allToAllForm = alltoallChoice_;
  o.sendBytes = blocks.sendBytes;  // which input blocks peers may read in place (huge pages)
  o.recvBytes = blocks.recvBytes;
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
  const bool relayed = pg_.planAlgorithm() == "alltoall/hosts-rail";
  setAlgorithm(relayed ? "multihost_rail" : "multihost_direct");
  setAllToAllPhases(m, relayed ? AllToAllHostsForm::Relay : AllToAllHostsForm::Direct);
}

}  // namespace hoccl
