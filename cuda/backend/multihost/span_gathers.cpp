// Data movement across hosts, dtype-blind (bytes): broadcast, all_gather, gather and scatter,
// each one plan across hosts (cuda/plan/).
#include "backend/multihost/host_span.h"
#include "backend/tensor_args.h"

namespace hoccl {

namespace {

// A dtype-blind op: members agree on the bytes each rank contributes (all_gather keeps the
// kind of the list form for the tensor form, which moves the same bytes).
OpSignature bytesSignature(c10d::OpType kind, const at::Tensor& t, int64_t root = -1) {
  return {static_cast<int64_t>(kind), -1, static_cast<int64_t>(t.numel() * t.element_size()), root};
}

}  // namespace

void HostSpan::broadcastFlat(const char* op, const at::Tensor& bytes, int root) {
  if (bytes.numel() == 0) return;
  ProcessGroupHOCCL::HostsOp o{op, OpKind::Broadcast, root};
  o.in = o.out = {ptr(bytes)};
  o.bytes = o.numel = bytes.numel();
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
}

void HostSpan::allgatherFlat(const char* op, const at::Tensor& in, const std::vector<at::Tensor>& outs) {
  const int64_t n = in.numel();
  if (n == 0) return;
  ProcessGroupHOCCL::HostsOp o{op, OpKind::AllGather};
  o.in = {ptr(in)};
  for (const auto& t : outs) o.out.push_back(ptr(t));
  o.bytes = o.numel = n;
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
}

void HostSpan::broadcastTensor(const at::Tensor& t, int root) {
  agreeOnRail("broadcast", bytesSignature(c10d::OpType::BROADCAST, t, root));
  broadcastFlat("broadcast", bytesOf(t), root);
}

void HostSpan::allgatherTensors(const char* op, const at::Tensor& in, const std::vector<at::Tensor>& outputs) {
  agreeOnRail(op, bytesSignature(c10d::OpType::ALLGATHER, in));
  std::vector<Staged> staged(outputs.begin(), outputs.end());
  std::vector<at::Tensor> outs;
  for (const auto& s : staged) outs.push_back(bytesOf(s.work));
  allgatherFlat(op, bytesOf(in), outs);
  for (const auto& s : staged) s.writeBack();
}

void HostSpan::gatherBlocks(const at::Tensor& in, const std::vector<at::Tensor>& outs, int root) {
  agreeOnRail("gather", bytesSignature(c10d::OpType::GATHER, in, root));
  const int64_t n = bytesOf(in).numel();
  if (n == 0) return;
  ProcessGroupHOCCL::HostsOp o{"gather", OpKind::Gather, root};
  o.in = {ptr(in)};
  o.out.assign(size_, nullptr);
  for (size_t r = 0; r < outs.size(); ++r) o.out[r] = ptr(outs[r]);
  o.bytes = o.numel = n;
  planned("gather", [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
}

// The plan reads each of the root's blocks where it is: nothing is packed.
void HostSpan::scatterBlocks(const std::vector<at::Tensor>& ins, const at::Tensor& out, int root) {
  agreeOnRail("scatter", bytesSignature(c10d::OpType::SCATTER, out, root));
  const int64_t n = bytesOf(out).numel();
  if (n == 0) return;
  ProcessGroupHOCCL::HostsOp o{"scatter", OpKind::Scatter, root};
  o.in.assign(size_, nullptr);
  for (size_t r = 0; r < ins.size(); ++r) o.in[r] = ptr(ins[r]);
  o.out = {ptr(out)};
  o.bytes = o.numel = n;
  planned("scatter", [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
}

void HostSpan::barrierAcrossHosts() {
  agreeOnRail("barrier", {static_cast<int64_t>(c10d::OpType::BARRIER), -1, 0});
  ProcessGroupHOCCL::HostsOp b{"barrier", OpKind::Barrier};
  planned("barrier", [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(b, tag); });
}

void HostSpan::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  groups_.global->monitoredBarrier(opts, waitAllRanks);
}

}  // namespace hoccl
