#include "backend/collective.h"
#include "backend/multihost/host_span.h"
#include "backend/sparse_allreduce.h"
#include "backend/tensor_args.h"

namespace hoccl {

void ProcessGroupHOCCL::allreduceTensor(const at::Tensor& t, RedOp op, double factor) {
  const at::Tensor tensor = reducible(t);
  Collective c{"all_reduce"};
  c.req.kind = OpKind::AllReduce;
  c.req.elemSize = tensor.element_size();
  c.req.bytes = nbytes(tensor);
  c.ctx.in = {ptr(tensor)};
  c.ctx.out = {ptr(tensor)};
  c.ctx.dtype = tensor.scalar_type();
  c.ctx.op = op;
  c.ctx.factor = factor;
  c.ctx.desc.numel = tensor.numel();
  runCollective(c);
}

// The entry points here serve every host layout: routeCuda takes CUDA tensors the layout's way,
// and a group spanning hosts runs the op as one plan across hosts, its arguments agreed across
// hosts first.
c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl all_reduce on rank ", rank_, ": expects one tensor, got ", tensors.size());
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "all_reduce");
  if (tensors[0].layout() != at::kStrided) return allreduceSparse(tensors, op);
  // The CUDA routing builds closures: on one host, the hottest entry point tests the device first.
  if (span_ || tensors[0].is_cuda()) {
    if (auto w = routeCuda("all_reduce", c10d::OpType::ALLREDUCE, tensors, tensors,
                           [this, opts](const std::vector<at::Tensor>&, const std::vector<at::Tensor>& ho) {
                             std::vector<at::Tensor> v{ho[0]};
                             return allreduce(v, opts);
                           },
                           tensors[0].is_complex() ? nullptr : ceAllReduce(tensors[0], op, factor)))
      return *w;
  }
  checkTensor(tensors[0], "all_reduce", rank_);
  checkReduceArgs(tensors[0], op, "all_reduce", rank_);
  Staged s(tensors[0]);
  return submit(c10d::OpType::ALLREDUCE, tensors, [this, s, op, factor] {
    if (span_) span_->allreduceTensor("all_reduce", c10d::OpType::ALLREDUCE, s.work, op, factor);
    else allreduceTensor(s.work, op, factor);
    s.writeBack();
  }, nbytes(tensors[0]), !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allreduceSparse(std::vector<at::Tensor>& tensors, RedOp op) {
  const at::Tensor& t = tensors[0];
  checkSparseAllreduce(t, op, rank_);
  if (span_) return span_->allreduceSparse(t, op);
  return enqueue(c10d::OpType::ALLREDUCE, tensors, [this, t, op] { runSparseAllreduce(t, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* name = "allreduce_coalesced";
  if (span_) {
    if (auto w = span_->viaHost(name, c10d::OpType::ALLREDUCE_COALESCED, tensors, tensors,
                                [this, opts](const std::vector<at::Tensor>&, const std::vector<at::Tensor>& outs) {
                                  std::vector<at::Tensor> v = outs;
                                  return allreduce_coalesced(v, opts);
                                }))
      return *w;
  } else if (anyCuda(tensors)) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : tensors) {
      std::vector<at::Tensor> v{t};
      works.push_back(allreduce(v, opts));
    }
    return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
  }
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, name);
  std::vector<Staged> staged;
  for (auto& t : tensors) {
    checkTensor(t, name, rank_);
    checkReduceArgs(t, op, name, rank_);
    staged.emplace_back(t);
  }
  return submit(c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, staged, op, factor, name] {
    for (const auto& s : staged) {
      if (span_) span_->allreduceTensor(name, c10d::OpType::ALLREDUCE_COALESCED, s.work, op, factor);
      else allreduceTensor(s.work, op, factor);
      s.writeBack();
    }
  }, INT64_MAX, !opts.asyncOp);
}

// The root gets the reduced value; other ranks keep their input.
c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl reduce on rank ", rank_, ": expects one tensor");
  if (auto w = routeCuda("reduce", c10d::OpType::REDUCE, tensors, tensors,
                         [this, opts](const std::vector<at::Tensor>&, const std::vector<at::Tensor>& ho) {
                           std::vector<at::Tensor> v{ho[0]};
                           return reduce(v, opts);
                         }))
    return *w;
  checkTensor(tensors[0], "reduce", rank_);
  checkRoot(static_cast<int>(opts.rootRank), size_, "reduce", rank_);
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce");
  checkReduceArgs(tensors[0], op, "reduce", rank_);
  Staged s(tensors[0]);
  int root = static_cast<int>(opts.rootRank);
  return submit(c10d::OpType::REDUCE, tensors, [this, s, root, op, factor] {
    if (span_) {
      span_->reduceTensor(s.work, root, op, factor);
      if (root == rank_) s.writeBack();
      return;
    }
    const at::Tensor t = reducible(s.work);
    Collective c{"reduce"};
    c.req.kind = OpKind::Reduce;
    c.req.root = root;
    c.req.elemSize = t.element_size();
    c.req.bytes = nbytes(t);
    c.ctx.in = c.ctx.out = {ptr(t)};
    c.ctx.dtype = t.scalar_type();
    c.ctx.op = op;
    c.ctx.factor = factor;
    c.ctx.desc.numel = t.numel();
    runCollective(c);
    s.writeBack();
  }, nbytes(tensors[0]), !opts.asyncOp);
}

void ProcessGroupHOCCL::reduceScatterBlocks(const std::vector<at::Tensor>& inputs, const at::Tensor& out,
                                            RedOp op, double factor) {
  if (span_) return span_->reduceScatterBlocks(inputs, out, op, factor);
  const at::Tensor output = reducible(out);
  Collective c{"reduce_scatter"};
  c.req.kind = OpKind::ReduceScatter;
  c.req.elemSize = output.element_size();
  c.req.bytes = nbytes(output);
  for (auto& t : inputs) c.ctx.in.push_back(ptr(t));
  c.ctx.out = {ptr(output)};
  c.ctx.dtype = output.scalar_type();
  c.ctx.op = op;
  c.ctx.factor = factor;
  c.ctx.desc.numel = output.numel();
  runCollective(c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "hoccl reduce_scatter on rank ", rank_,
              ": expects one output and one input list");
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == size_, "hoccl reduce_scatter on rank ", rank_,
              ": input list has ", inputs[0].size(), " tensors but the group has ", size_, " ranks");
  if (auto w = routeCuda("reduce_scatter", c10d::OpType::REDUCE_SCATTER, inputs[0], outputs,
                         [this, opts](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                           std::vector<at::Tensor> o = ho;
                           std::vector<std::vector<at::Tensor>> i{hi};
                           return reduce_scatter(o, i, opts);
                         }))
    return *w;
  checkTensor(outputs[0], "reduce_scatter", rank_);
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce_scatter");
  checkReduceArgs(outputs[0], op, "reduce_scatter", rank_);
  std::vector<at::Tensor> ins;
  for (auto& t : inputs[0]) {
    checkTensor(t, "reduce_scatter", rank_);
    checkSameAs(t, outputs[0], "reduce_scatter", rank_, "an input tensor");
    ins.push_back(t.contiguous());
  }
  Staged out(outputs[0]);
  return submit(c10d::OpType::REDUCE_SCATTER, outputs, [this, ins, out, op, factor] {
    reduceScatterBlocks(ins, out.work, op, factor);
    out.writeBack();
  }, INT64_MAX, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  if (auto w = routeCuda("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, {input}, {output},
                         [this, opts](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                           at::Tensor i = hi[0], o = ho[0];
                           return _reduce_scatter_base(o, i, opts);
                         }))
    return *w;
  checkTensor(input, "reduce_scatter_tensor", rank_);
  checkTensor(output, "reduce_scatter_tensor", rank_);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hoccl reduce_scatter_tensor on rank ", rank_,
              ": output dtype ", output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(input.numel() == output.numel() * size_, "hoccl reduce_scatter_tensor on rank ", rank_,
              ": input has ", input.numel(), " elements but must have world_size x output = ",
              output.numel() * size_);
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce_scatter_tensor");
  checkReduceArgs(output, op, "reduce_scatter_tensor", rank_);
  at::Tensor in = input.contiguous().view({-1});
  Staged out(output);
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [this, in, out, op, factor] {
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < size_; ++r) blocks.push_back(in.narrow(0, r * out.work.numel(), out.work.numel()));
    reduceScatterBlocks(blocks, out.work, op, factor);
    out.writeBack();
  }, nbytes(input), !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hoccl reduce_scatter_tensor_coalesced on rank ", rank_, ": ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

}  // namespace hoccl
