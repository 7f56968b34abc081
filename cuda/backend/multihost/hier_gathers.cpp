// Data movement across hosts, dtype-blind (bytes): broadcast, all_gather, gather and scatter,
// each one plan across hosts (cuda/plan/), except all_gather's legs on even hosts where they
// measured faster (allGatherAsPlan): each chunk crosses along the rail first (every block to each
// other host once), then one all-gather inside the host.
#include "backend/multihost/legs.h"
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

// Even hosts, pipelined: the input goes in chunks. Each chunk crosses point to point to the
// rank's rail peers (straight from the input, into a buffer per host), and the host then
// all-gathers every host's chunk straight into the outputs: one host all_gather per host, this
// host's own while the first chunks cross, and no byte is copied twice.
void HostSpan::allgatherRails(const char* op, const at::Tensor& in, const std::vector<at::Tensor>& outs) {
  const int64_t n = in.numel(), H = layout_.hosts();
  const int64_t chunk = legs::pipelineChunk(n, 1, 1);
  const auto& ranksOf = layout_.table.ranksOf;
  at::Tensor arrived = scratch((H - 1) * n);
  struct Piece {
    int64_t off, len;
    std::vector<at::Tensor> from;  // per host: its rail member's chunk
    std::vector<c10::intrusive_ptr<c10d::Work>> crossing;
  };
  std::vector<Piece> pieces;
  auto gatherInHost = [&](Piece& p, int64_t h) {
    std::vector<at::Tensor> to;
    for (int r : ranksOf[h]) to.push_back(outs[r].narrow(0, p.off, p.len));
    checkUsable(op);
    pg_.allgatherOnHost(to, p.from[h]);
  };
  pieces.reserve((n + chunk - 1) / chunk);
  const auto posted = std::chrono::steady_clock::now();
  try {
    for (int64_t off = 0; off < n; off += chunk) {
      pieces.push_back(Piece{off, std::min(chunk, n - off)});
      Piece& p = pieces.back();
      const int tag = crossTag();
      int64_t slot = 0;
      for (int64_t h = 0; h < H; ++h) {
        if (h == host_) {
          p.from.push_back(in.narrow(0, off, p.len));
          continue;
        }
        p.from.push_back(arrived.narrow(0, slot++ * n + off, p.len));
        const int peer = layout_.railRank(ranksOf[h][localRank_]);
        p.crossing.push_back(startTransfer(op, *groups_.rail, myRail_, false, peer, p.from.back(), tag));
        p.crossing.push_back(startTransfer(op, *groups_.rail, myRail_, true, peer, in.narrow(0, off, p.len), tag));
      }
      gatherInHost(p, host_);
    }
    for (auto& p : pieces) {
      for (auto& w : p.crossing) waitAcross(op, myRail_, w);
      for (int64_t h = 0; h < H; ++h)
        if (h != host_) gatherInHost(p, h);
    }
  } catch (...) {
    // gloo may still be writing into the scratch and the outputs.
    for (auto& p : pieces) legs::drain(p.crossing, posted + timeout_);
    throw;
  }
}

void HostSpan::allgatherFlat(const char* op, const at::Tensor& in, const std::vector<at::Tensor>& outs) {
  const int64_t n = in.numel();
  if (n == 0) return;
  if (!allGatherAsPlan(n)) {
    setAlgorithm("multihost_rails");
    allgatherRails(op, in, outs);
    return;
  }
  ProcessGroupHOCCL::HostsOp o{op, OpKind::AllGather};
  o.in = {ptr(in)};
  for (const auto& t : outs) o.out.push_back(ptr(t));
  o.bytes = o.numel = n;
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
}

void HostSpan::broadcastTensor(const at::Tensor& t, int root) {
  agreeOnRail("broadcast", bytesSignature(c10d::OpType::BROADCAST, t, root));
  broadcastFlat("broadcast", legs::bytesOf(t), root);
}

void HostSpan::allgatherTensors(const char* op, const at::Tensor& in, const std::vector<at::Tensor>& outputs) {
  const int64_t n = legs::bytesOf(in).numel();
  agreeOnRail(op, bytesSignature(c10d::OpType::ALLGATHER, in),
              n == 0 || allGatherAsPlan(n) ? CheckVia::Rail : CheckVia::PlansEngine);
  std::vector<Staged> staged(outputs.begin(), outputs.end());
  std::vector<at::Tensor> outs;
  for (const auto& s : staged) outs.push_back(legs::bytesOf(s.work));
  allgatherFlat(op, legs::bytesOf(in), outs);
  for (const auto& s : staged) s.writeBack();
}

void HostSpan::gatherBlocks(const at::Tensor& in, const std::vector<at::Tensor>& outs, int root) {
  agreeOnRail("gather", bytesSignature(c10d::OpType::GATHER, in, root));
  const int64_t n = legs::bytesOf(in).numel();
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
  const int64_t n = legs::bytesOf(out).numel();
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
