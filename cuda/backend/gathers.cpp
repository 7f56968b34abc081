#include "backend/collective.h"
#include "backend/multihost/host_span.h"
#include "backend/tensor_args.h"

namespace hoccl {

using Tensors = std::vector<at::Tensor>;

// The entry points here serve every host layout: routeCuda takes CUDA tensors the layout's way,
// and a group spanning hosts runs the op as one plan across hosts.
c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl broadcast on rank ", rank_, ": expects one tensor");
  checkRoot(static_cast<int>(opts.rootRank), size_, "broadcast", rank_);
  if (auto w = routeCuda("broadcast", c10d::OpType::BROADCAST, tensors, tensors,
                         [this, opts](const Tensors&, const Tensors& ho) {
                           Tensors v{ho[0]};
                           return broadcast(v, opts);
                         },
                         ceBroadcast(tensors[0], static_cast<int>(opts.rootRank))))
    return *w;
  checkTensor(tensors[0], "broadcast", rank_);
  Staged s(tensors[0]);
  int root = static_cast<int>(opts.rootRank);
  return submit(c10d::OpType::BROADCAST, tensors, [this, s, root] {
    if (span_) {
      span_->broadcastTensor(s.work, root);
    } else {
      Collective c{"broadcast"};
      c.req.kind = OpKind::Broadcast;
      c.req.root = root;
      c.req.elemSize = s.work.element_size();
      c.req.bytes = nbytes(s.work);
      c.ctx.in = c.ctx.out = {ptr(s.work)};
      c.ctx.dtype = s.work.scalar_type();
      c.ctx.desc.numel = s.work.numel();
      runCollective(c);
    }
    s.writeBack();
  }, nbytes(tensors[0]), !opts.asyncOp);
}

void ProcessGroupHOCCL::allgatherBlocks(const at::Tensor& input, const std::vector<at::Tensor>& outputs,
                                        OpKind kind, int root) {
  Collective c{kind == OpKind::Gather ? "gather" : "all_gather"};
  c.req.kind = kind;
  c.req.root = root;
  c.req.elemSize = input.element_size();
  c.req.bytes = nbytes(input);
  c.ctx.in = {ptr(input)};
  c.ctx.out.assign(localSize_, nullptr);
  for (size_t r = 0; r < outputs.size(); ++r) c.ctx.out[r] = ptr(outputs[r]);
  c.ctx.dtype = input.scalar_type();
  c.ctx.desc.numel = input.numel();
  runCollective(c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "hoccl all_gather on rank ", rank_,
              ": expects one input and one output list");
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "hoccl all_gather on rank ", rank_,
              ": output list has ", outputs[0].size(), " tensors but the group has ", size_, " ranks");
  if (auto w = routeCuda("all_gather", c10d::OpType::ALLGATHER, inputs, outputs[0],
                         [this, opts](const Tensors& hi, const Tensors& ho) {
                           std::vector<Tensors> o{ho};
                           Tensors i = hi;
                           return allgather(o, i, opts);
                         }))
    return *w;
  checkTensor(inputs[0], "all_gather", rank_);
  for (auto& t : outputs[0]) {
    checkTensor(t, "all_gather", rank_);
    checkSameAs(t, inputs[0], "all_gather", rank_, "an output tensor");
  }
  // Across hosts the input may cross while outputs are written: a copy where it overlaps one.
  at::Tensor in = (span_ ? readableWhileWriting(inputs[0], outputs[0]) : inputs[0]).contiguous();
  return submit(c10d::OpType::ALLGATHER, outputs[0], [this, in, outs = outputs[0]] {
    if (span_) span_->allgatherTensors("all_gather", in, outs);
    else allgatherOnHost(outs, in);
  }, nbytes(inputs[0]) * size_, !opts.asyncOp);
}

void ProcessGroupHOCCL::allgatherOnHost(const std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  std::vector<Staged> outs(outputs.begin(), outputs.end());
  std::vector<at::Tensor> o;
  for (auto& s : outs) o.push_back(s.work);
  allgatherBlocks(input.contiguous(), o, OpKind::AllGather, 0);
  for (auto& s : outs) s.writeBack();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  if (auto w = routeCuda(op, c10d::OpType::_ALLGATHER_BASE, {input}, {output},
                         [this, opts](const Tensors& hi, const Tensors& ho) {
                           at::Tensor i = hi[0], o = ho[0];
                           return _allgather_base(o, i, opts);
                         },
                         output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type()
                             ? ceAllGather(output, input) : nullptr))
    return *w;
  checkTensor(input, op, rank_);
  checkTensor(output, op, rank_);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hoccl ", op, " on rank ", rank_,
              ": output dtype ", output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * size_, "hoccl ", op, " on rank ", rank_,
              ": output has ", output.numel(), " elements but must have world_size x input = ",
              input.numel() * size_);
  Staged out(output);
  at::Tensor in = (span_ ? readableWhileWriting(input, {output}) : input).contiguous();
  return submit(c10d::OpType::_ALLGATHER_BASE, {output}, [this, in, out, op] {
    auto flat = out.work.view({-1});
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < size_; ++r) blocks.push_back(flat.narrow(0, r * in.numel(), in.numel()));
    if (span_) span_->allgatherTensors(op, in, blocks);
    else allgatherBlocks(in, blocks, OpKind::AllGather, 0);
    out.writeBack();
  }, nbytes(output), !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hoccl allgather_into_tensor_coalesced on rank ", rank_,
              ": ", outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputLists[r][i] receives rank r's inputs[i].
  TORCH_CHECK(static_cast<int>(outputLists.size()) == size_, "hoccl allgather_coalesced on rank ", rank_,
              ": ", outputLists.size(), " output lists for a group of ", size_, " ranks");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> o(1);
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(outputLists[r].size() == inputs.size(), "hoccl allgather_coalesced on rank ", rank_,
                  ": output list ", r, " has ", outputLists[r].size(), " tensors for ", inputs.size(), " inputs");
      o[0].push_back(outputLists[r][i]);
      all.push_back(outputLists[r][i]);
    }
    std::vector<at::Tensor> in{inputs[i]};
    works.push_back(allgather(o, in, opts));
  }
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  checkRoot(root, size_, "gather", rank_);
  TORCH_CHECK(inputs.size() == 1, "hoccl gather on rank ", rank_, ": expects one input tensor");
  const bool noOutputs = outputs.empty();
  const std::vector<at::Tensor> result = noOutputs ? std::vector<at::Tensor>{} : outputs[0];
  if (auto w = routeCuda("gather", c10d::OpType::GATHER, inputs, result,
                         [this, opts, noOutputs](const Tensors& hi, const Tensors& ho) {
                           std::vector<Tensors> o;
                           if (!noOutputs) o.push_back(ho);
                           Tensors i = hi;
                           return gather(o, i, opts);
                         }))
    return *w;
  checkTensor(inputs[0], "gather", rank_);
  std::vector<Staged> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "hoccl gather on rank ",
                rank_, ": the root needs a list of ", size_, " output tensors");
    for (auto& t : outputs[0]) {
      checkTensor(t, "gather", rank_);
      checkSameAs(t, inputs[0], "gather", rank_, "an output tensor");
      outs.emplace_back(t);
    }
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "hoccl gather on rank ", rank_,
                ": only the root (rank ", root, ") may pass output tensors");
  }
  // Across hosts the root's input may also be one of its outputs: a copy of it crosses.
  at::Tensor in = span_ ? inputs[0].contiguous().clone() : inputs[0].contiguous();
  return submit(c10d::OpType::GATHER, result, [this, in, outs, root] {
    std::vector<at::Tensor> o;
    for (auto& s : outs) o.push_back(s.work);
    if (span_) span_->gatherBlocks(in, o, root);
    else allgatherBlocks(in, o, OpKind::Gather, root);
    for (auto& s : outs) s.writeBack();
  }, INT64_MAX, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  checkRoot(root, size_, "scatter", rank_);
  TORCH_CHECK(outputs.size() == 1, "hoccl scatter on rank ", rank_, ": expects one output tensor");
  const bool noInputs = inputs.empty();
  const std::vector<at::Tensor> given = noInputs ? std::vector<at::Tensor>{} : inputs[0];
  if (auto w = routeCuda("scatter", c10d::OpType::SCATTER, given, outputs,
                         [this, opts, noInputs](const Tensors& hi, const Tensors& ho) {
                           std::vector<Tensors> i;
                           if (!noInputs) i.push_back(hi);
                           Tensors o = ho;
                           return scatter(o, i, opts);
                         }))
    return *w;
  checkTensor(outputs[0], "scatter", rank_);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "hoccl scatter on rank ",
                rank_, ": the root needs a list of ", size_, " input tensors");
    for (auto& t : inputs[0]) {
      checkTensor(t, "scatter", rank_);
      checkSameAs(t, outputs[0], "scatter", rank_, "an input tensor");
      ins.push_back(t.contiguous());
    }
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "hoccl scatter on rank ", rank_,
                ": only the root (rank ", root, ") may pass input tensors");
  }
  Staged out(outputs[0]);
  return submit(c10d::OpType::SCATTER, outputs, [this, ins, out, root] {
    if (span_) {
      span_->scatterBlocks(ins, out.work, root);
    } else {
      Collective c{"scatter"};
      c.req.kind = OpKind::Scatter;
      c.req.root = root;
      c.req.elemSize = out.work.element_size();
      c.req.bytes = nbytes(out.work);
      c.ctx.in.assign(localSize_, nullptr);
      for (size_t r = 0; r < ins.size(); ++r) c.ctx.in[r] = ptr(ins[r]);
      c.ctx.out = {ptr(out.work)};
      c.ctx.dtype = out.work.scalar_type();
      c.ctx.desc.numel = out.work.numel();
      runCollective(c);
    }
    out.writeBack();
  }, INT64_MAX, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::barrier(const c10d::BarrierOptions& opts) {
  return submit(c10d::OpType::BARRIER, {}, [this] {
    if (span_) {
      span_->barrierAcrossHosts();
      return;
    }
    Collective c{"barrier"};
    c.req.kind = OpKind::Barrier;
    runCollective(c);
  }, 0, span_ && !opts.asyncOp);
}

}  // namespace hoccl
