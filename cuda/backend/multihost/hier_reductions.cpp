// Reductions across hosts: argument checks, agreement across hosts, and one plan per op
// (cuda/plan/allreduce_hosts.cpp, reduce_scatter_hosts.cpp; docs/multihost.md). Sums of fp16/bf16
// accumulate in float inside each host; every rank ends with the same bytes.
#include "backend/multihost/legs.h"
#include "backend/multihost/host_span.h"
#include "backend/sparse_allreduce.h"
#include "backend/tensor_args.h"

namespace hoccl {

namespace {

using Tensors = std::vector<at::Tensor>;

void checkHostTensor(const at::Tensor& t, const char* op, int rank) {
  TORCH_CHECK(!t.defined() || !t.is_cuda(), "hoccl ", op, " on rank ", rank,
              ": CUDA tensors in a group spanning hosts are not supported yet (copy to the CPU first)");
  checkTensor(t, op, rank);
}

OpSignature reductionSignature(c10d::OpType kind, const at::Tensor& t, RedOp op, int64_t root = -1) {
  return {static_cast<int64_t>(kind), static_cast<int64_t>(t.scalar_type()), t.numel(), root, static_cast<int64_t>(op)};
}

}  // namespace

void checkMultiHostTensor(const at::Tensor& t, const char* op, int rank) { checkHostTensor(t, op, rank); }

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

c10::intrusive_ptr<c10d::Work> HostSpan::allreduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl all_reduce on rank ", rank_, ": expects one tensor, got ", tensors.size());
  if (tensors[0].layout() != at::kStrided) {
    double unused;
    return allreduceSparse(tensors[0], toRedOp(opts.reduceOp, &unused, "all_reduce"));
  }
  if (auto w = viaHost("all_reduce", c10d::OpType::ALLREDUCE, tensors, tensors,
                       [this, opts](const Tensors&, const Tensors& outs) {
                         Tensors v{outs[0]};
                         return allreduce(v, opts);
                       }))
    return *w;
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "all_reduce");
  checkHostTensor(tensors[0], "all_reduce", rank_);
  checkReduceArgs(tensors[0], op, "all_reduce", rank_);
  Staged s(tensors[0]);
  return enqueue(c10d::OpType::ALLREDUCE, tensors, [this, s, op, factor] {
    allreduceTensor("all_reduce", c10d::OpType::ALLREDUCE, s.work, op, factor);
    s.writeBack();
  }, !opts.asyncOp);
}

void HostSpan::allreduceTensor(const char* op, c10d::OpType kind, const at::Tensor& t, RedOp redOp, double factor) {
  agreeOnRail(op, reductionSignature(kind, t, redOp));
  allreduceFlat(op, reducible(t).view(-1), redOp, factor);
}

// The same steps as on one host (sparse_allreduce.h), over this group's all_gather. The first
// gather (the fixed-size header) agrees across hosts first, like every collective here; the
// later ones take their sizes from the headers every rank has checked, so they agree already.
c10::intrusive_ptr<c10d::Work> HostSpan::allreduceSparse(const at::Tensor& t, RedOp op) {
  checkSparseAllreduce(t, op, rank_);
  return enqueue(c10d::OpType::ALLREDUCE, {t}, [this, t, op] {
    bool agreed = false;
    sparseAllreduce(t, op, rank_, size_, [this, &agreed](const at::Tensor& block, const std::vector<at::Tensor>& outs) {
      const at::Tensor bytes = legs::bytesOf(block);
      if (!agreed) agreeOnRail("all_reduce", {static_cast<int64_t>(c10d::OpType::ALLREDUCE), -1, bytes.numel()});
      agreed = true;
      std::vector<at::Tensor> byteOuts;
      for (const auto& o : outs) byteOuts.push_back(legs::bytesOf(o));
      allgatherFlat("all_reduce", bytes, byteOuts);
    });
  });
}

// The root gets the all-reduced value; other ranks keep their input.
c10::intrusive_ptr<c10d::Work> HostSpan::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl reduce on rank ", rank_, ": expects one tensor, got ", tensors.size());
  if (auto w = viaHost("reduce", c10d::OpType::REDUCE, tensors, tensors,
                       [this, opts](const Tensors&, const Tensors& outs) {
                         Tensors v{outs[0]};
                         return reduce(v, opts);
                       }))
    return *w;
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce");
  checkHostTensor(tensors[0], "reduce", rank_);
  checkReduceArgs(tensors[0], op, "reduce", rank_);
  checkRoot(static_cast<int>(opts.rootRank), size_, "reduce", rank_);
  Staged s(tensors[0]);
  bool root = opts.rootRank == rank_;
  const int64_t rootRank = opts.rootRank;
  return enqueue(c10d::OpType::REDUCE, tensors, [this, s, op, factor, root, rootRank] {
    agreeOnRail("reduce", reductionSignature(c10d::OpType::REDUCE, s.work, op, rootRank));
    at::Tensor w = root ? s.work : s.work.clone();
    allreduceFlat("reduce", reducible(w).view(-1), op, factor);
    if (root) s.writeBack();
  }, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> HostSpan::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "hoccl reduce_scatter on rank ", rank_,
              ": expects one output and one input list");
  TORCH_CHECK((int)inputs[0].size() == size_, "hoccl reduce_scatter on rank ", rank_, ": expects ", size_,
              " inputs, got ", inputs[0].size());
  if (auto w = viaHost("reduce_scatter", c10d::OpType::REDUCE_SCATTER, inputs[0], outputs,
                       [this, opts](const Tensors& ins, const Tensors& outs) {
                         Tensors o = outs;
                         std::vector<Tensors> i{ins};
                         return reduce_scatter(o, i, opts);
                       }))
    return *w;
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce_scatter");
  checkHostTensor(outputs[0], "reduce_scatter", rank_);
  checkReduceArgs(outputs[0], op, "reduce_scatter", rank_);
  std::vector<at::Tensor> blocks;
  for (auto& in : inputs[0]) {
    checkHostTensor(in, "reduce_scatter", rank_);
    checkSameAs(in, outputs[0], "reduce_scatter", rank_, "an input");
    blocks.push_back(reducible(in.contiguous()).view(-1));
  }
  Staged s(outputs[0]);
  return enqueue(c10d::OpType::REDUCE_SCATTER, outputs, [this, s, blocks, op, factor] {
    agreeOnRail("reduce_scatter", reductionSignature(c10d::OpType::REDUCE_SCATTER, s.work, op));
    reduceScatterFlat("reduce_scatter", blocks, reducible(s.work).view(-1), op, factor);
    s.writeBack();
  }, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> HostSpan::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::ReduceScatterOptions& opts) {
  if (auto w = viaHost("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, {input}, {output},
                       [this, opts](const Tensors& ins, const Tensors& outs) {
                         at::Tensor i = ins[0], o = outs[0];
                         return _reduce_scatter_base(o, i, opts);
                       }))
    return *w;
  checkHostTensor(input, "reduce_scatter_tensor", rank_);
  checkHostTensor(output, "reduce_scatter_tensor", rank_);
  TORCH_CHECK(input.numel() == output.numel() * size_ && input.scalar_type() == output.scalar_type(),
              "hoccl reduce_scatter_tensor on rank ", rank_, ": the input has ", input.numel(), " ",
              input.scalar_type(), " elements; expected ", size_, " x the output's ", output.numel(), " ",
              output.scalar_type());
  std::vector<at::Tensor> outs{output};
  std::vector<std::vector<at::Tensor>> ins{input.contiguous().view(-1).chunk(size_)};
  if (output.numel() == 0) ins[0].assign(size_, at::empty({0}, output.options()));
  return reduce_scatter(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> HostSpan::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < outputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

}  // namespace hoccl
