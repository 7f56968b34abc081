// Reductions across hosts: argument checks, agreement across hosts, and one plan per op
// (cuda/plan/allreduce_hosts.cpp, reduce_scatter_hosts.cpp; docs/multihost.md). Sums of fp16/bf16
// accumulate in float inside each host; every rank ends with the same bytes.
#include "backend/multihost/host_span.h"
#include "backend/sparse_allreduce.h"
#include "backend/tensor_args.h"

namespace hoccl {

namespace {

OpSignature reductionSignature(c10d::OpType kind, const at::Tensor& t, RedOp op, int64_t root = -1) {
  return {static_cast<int64_t>(kind), static_cast<int64_t>(t.scalar_type()), t.numel(), root, static_cast<int64_t>(op)};
}

}  // namespace

void HostSpan::allreduceFlat(const char* op, const at::Tensor& flat, RedOp redOp, double factor) {
  if (flat.numel() == 0) return;
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.allreduceAcrossHosts(flat, redOp, factor, tag); });
}

void HostSpan::reduceScatterFlat(const char* op, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                                       RedOp redOp, double factor) {
  const int64_t n = out.numel();
  if (n == 0) return;
  ProcessGroupHOCCL::HostsOp o{op, OpKind::ReduceScatter};
  for (const auto& b : blocks) o.in.push_back(ptr(b));
  o.out = {ptr(out)};
  o.elemSize = out.element_size();
  o.bytes = nbytes(out);
  o.numel = n;
  o.dtype = out.scalar_type();
  o.op = redOp;
  o.factor = factor;
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
}

void HostSpan::allreduceTensor(const char* op, c10d::OpType kind, const at::Tensor& t, RedOp redOp, double factor) {
  agreeOnRail(op, reductionSignature(kind, t, redOp));
  allreduceFlat(op, reducible(t).view(-1), redOp, factor);
}

// The same steps as on one host (sparse_allreduce.h), over this group's all_gather. The first
// gather (the fixed-size header) agrees across hosts first, like every collective here; the
// later ones take their sizes from the headers every rank has checked, so they agree already.
c10::intrusive_ptr<c10d::Work> HostSpan::allreduceSparse(const at::Tensor& t, RedOp op) {
  return enqueue(c10d::OpType::ALLREDUCE, {t}, [this, t, op] {
    bool agreed = false;
    sparseAllreduce(t, op, rank_, size_, [this, &agreed](const at::Tensor& block, const std::vector<at::Tensor>& outs) {
      const at::Tensor bytes = bytesOf(block);
      if (!agreed) agreeOnRail("all_reduce", {static_cast<int64_t>(c10d::OpType::ALLREDUCE), -1, bytes.numel()});
      agreed = true;
      std::vector<at::Tensor> byteOuts;
      for (const auto& o : outs) byteOuts.push_back(bytesOf(o));
      allgatherFlat("all_reduce", bytes, byteOuts);
    });
  });
}

void HostSpan::reduceTensor(const at::Tensor& t, int root, RedOp redOp, double factor) {
  agreeOnRail("reduce", reductionSignature(c10d::OpType::REDUCE, t, redOp, root));
  // Every rank runs the all-reduce; the root's tensor takes the result, the others' keep theirs.
  at::Tensor w = root == rank_ ? t : t.clone();
  allreduceFlat("reduce", reducible(w).view(-1), redOp, factor);
}

void HostSpan::reduceScatterBlocks(const std::vector<at::Tensor>& inputs, const at::Tensor& out, RedOp redOp,
                                   double factor) {
  agreeOnRail("reduce_scatter", reductionSignature(c10d::OpType::REDUCE_SCATTER, out, redOp));
  std::vector<at::Tensor> blocks;
  for (const auto& in : inputs) blocks.push_back(reducible(in).view(-1));
  reduceScatterFlat("reduce_scatter", blocks, reducible(out).view(-1), redOp, factor);
}

}  // namespace hoccl
