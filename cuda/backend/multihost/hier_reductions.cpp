// Reductions across hosts. Large all_reduce on even hosts: reduce-scatter inside each host,
// all_reduce of each shard along its rail, all-gather inside each host (each byte crosses hosts
// on one rail only). Small ones, and uneven hosts: reduce to each host's leader, all_reduce
// among the leaders, broadcast inside each host. The rail leg sums (AVG and PREMUL_SUM are scaled
// once, after it), in float for fp16/bf16; every rank ends with the bytes one rail member
// computed, so results are identical everywhere.
#include "backend/multihost/legs.h"
#include "backend/multihost/multihost_group.h"
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

void MultiHostGroup::finishReduction(const at::Tensor& t, RedOp op, double factor) const {
  postScale(t.data_ptr(), t.numel(), t.scalar_type(), op, factor, size_);
}

void MultiHostGroup::railAllreduce(const char* op, const at::Tensor& t, RedOp redOp, double factor) {
  at::Tensor wide = t.to(legs::acrossDtype(t.scalar_type()));
  across(op, *groups_.rail, myRail_, [&](c10d::Backend& g) {
    std::vector<at::Tensor> v{wide};
    return g.allreduce(v, legs::allreduceOpts(redOp));
  });
  finishReduction(wide, redOp, factor);
  if (!wide.is_same(t)) t.copy_(wide);
}

void MultiHostGroup::allreduceFlat(const char* op, const at::Tensor& flat, RedOp redOp, double factor) {
  if (flat.numel() == 0) return;
  if (runsAsPlan(OpKind::AllReduce)) {
    planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.allreduceAcrossHosts(flat, redOp, factor, tag); });
    return;
  }
  int L = layout_.localSize(host_);
  bool leaders = !layout_.even || nbytes(flat) <= leaderMaxBytes_ || flat.numel() < L;
  setAlgorithm(leaders ? "multihost_leaders" : "multihost_rails");
  if (leaders)
    allreduceLeaders(op, flat, redOp, factor);
  else
    allreduceRails(op, flat, redOp, factor);
}

// The rails form, pipelined: the buffer goes in chunks, so that the rail leg of one chunk runs
// while the host reduce-scatters the next and all-gathers the previous one (the local group and
// each gloo group run their ops in issue order on their own threads). Only the first chunk's
// reduce-scatter and the last one's all-gather are not hidden behind the link.
void MultiHostGroup::allreduceRails(const char* op, const at::Tensor& flat, RedOp redOp, double factor) {
  const int64_t L = layout_.localSize(host_), n = flat.numel();
  const int64_t chunk = legs::pipelineChunk(n, flat.element_size(), L);
  struct Piece {
    at::Tensor in, shard, wide, out, user;  // out is `user` unless the piece was padded
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Piece> pieces;
  // Shards live in the group's scratch buffer: the same pages every call, so the local legs
  // neither fault them in again nor re-promote them onto huge pages (both cost more than the
  // copies here).
  const int64_t esize = flat.element_size();
  at::Tensor shards = scratch(((n + chunk - 1) / chunk + n / L + 1) * esize);
  int64_t shardOff = 0;
  for (int64_t off = 0; off < n; off += chunk) {
    Piece p;
    p.user = flat.narrow(0, off, std::min(chunk, n - off));
    const int64_t c = (p.user.numel() + L - 1) / L;
    p.in = p.user;
    p.out = p.user;
    if (p.user.numel() % L != 0) {
      p.in = at::zeros({c * L}, flat.options());
      p.in.narrow(0, 0, p.user.numel()).copy_(p.user);
      p.out = at::empty({c * L}, flat.options());
    }
    p.shard = shards.narrow(0, shardOff * esize, c * esize).view(flat.scalar_type());
    shardOff += c;
    pieces.push_back(std::move(p));
  }
  checkUsable(op);
  for (auto& p : pieces) p.work = groups_.local->_reduce_scatter_base(p.shard, p.in, legs::reduceScatterOpts(redOp));
  for (auto& p : pieces) {
    p.work->wait();
    p.wide = p.shard.to(legs::acrossDtype(p.shard.scalar_type()));
    std::vector<at::Tensor> v{p.wide};
    p.work = startAcross(op, *groups_.rail, myRail_, [&](c10d::Backend& g) {
      return g.allreduce(v, legs::allreduceOpts(redOp));
    });
  }
  for (auto& p : pieces) {
    waitAcross(op, myRail_, p.work);
    finishReduction(p.wide, redOp, factor);
    if (!p.wide.is_same(p.shard)) p.shard.copy_(p.wide);
    checkUsable(op);
    p.work = groups_.local->_allgather_base(p.out, p.shard, c10d::AllgatherOptions());
  }
  for (auto& p : pieces) {
    p.work->wait();
    if (!p.out.is_same(p.user)) p.user.copy_(p.out.narrow(0, 0, p.user.numel()));
  }
}

void MultiHostGroup::allreduceLeaders(const char* op, const at::Tensor& flat, RedOp redOp, double factor) {
  local(op, [&](ProcessGroupHOCCL& g) {
    std::vector<at::Tensor> v{flat};
    c10d::ReduceOptions o;
    o.reduceOp = legs::partialOp(redOp);
    o.rootRank = 0;
    return g.reduce(v, o);
  });
  if (localRank_ == 0) railAllreduce(op, flat, redOp, factor);  // rail 0 is the host leaders
  local(op, [&](ProcessGroupHOCCL& g) {
    std::vector<at::Tensor> v{flat};
    return g.broadcast(v, legs::broadcastOpts(0));
  });
}

// Local rank l ends the host's leg with its host's partial sums of the blocks that rail l's
// members own, in host order; the rail's exchange then gives each member every host's partial
// of its block, which it reduces in host order (the same order on every rank).
void MultiHostGroup::reduceScatterFlat(const char* op, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                                       RedOp redOp, double factor) {
  const int64_t n = out.numel();
  if (n == 0) return;
  if (runsAsPlan(OpKind::ReduceScatter)) {
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
    return;
  }
  if (!layout_.even) {
    setAlgorithm("multihost_leaders");
    at::Tensor packed = at::cat(blocks);
    allreduceLeaders(op, packed, redOp, factor);
    out.copy_(packed.narrow(0, rank_ * n, n));
    return;
  }
  setAlgorithm("multihost_rails");
  reduceScatterRails(op, blocks, out, redOp, factor);
}

// Pipelined in chunks of every block, like all_reduce's rails form: the host's reduce-scatter of
// chunk k+1 runs (on the local group's thread) while chunk k's partials cross on the rail.
// The rail leg is point to point (each member sends each other host's member the partial of
// that member's block), not gloo's reduce_scatter, which is an all_reduce (twice the bytes
// across hosts).
void MultiHostGroup::reduceScatterRails(const char* op, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                                        RedOp redOp, double factor) {
  const int64_t n = out.numel(), H = layout_.hosts(), L = layout_.localSize(host_);
  const at::ScalarType dtype = out.scalar_type(), wideType = legs::acrossDtype(dtype);
  const int64_t esize = out.element_size();
  const int64_t chunk = legs::pipelineChunk(n, esize, 1);
  const auto& ranksOf = layout_.table.ranksOf;
  // Packed inputs and the host's partials live in the group's scratch (the same pages every
  // call); partials from other hosts arrive in fresh buffers of the wide type.
  auto aligned = [](int64_t b) { return (b + 63) / 64 * 64; };
  const int64_t packedBytes = aligned(L * H * n * esize);
  at::Tensor area = scratch(packedBytes + aligned(H * n * esize));
  at::Tensor packed = area.narrow(0, 0, L * H * n * esize).view(dtype);
  at::Tensor parts = area.narrow(0, packedBytes, H * n * esize).view(dtype);
  at::Tensor arrived = at::empty({(H - 1) * n}, out.options().dtype(wideType));
  struct Piece {
    int64_t off, len;
    at::Tensor packed, part, wide;
    std::vector<at::Tensor> from;  // per host: its partial of this chunk of my block
    c10::intrusive_ptr<c10d::Work> reduced;
    std::vector<c10::intrusive_ptr<c10d::Work>> crossing;
  };
  std::vector<Piece> pieces;
  // Chunk k's partials start across once the host has reduced them and chunk k+1 is packed and
  // handed to the local group, so packing and the host's reduction hide behind the link.
  auto cross = [&](Piece& p) {
    p.reduced->wait();
    p.wide = p.part.to(wideType);
    const int tag = crossTag();
    int64_t slot = 0;
    for (int64_t h = 0; h < H; ++h) {
      if (h == host_) {
        p.from.push_back(p.wide.narrow(0, h * p.len, p.len));
        continue;
      }
      p.from.push_back(arrived.narrow(0, slot++ * n + p.off, p.len));
      const int peer = layout_.railRank(ranksOf[h][localRank_]);
      p.crossing.push_back(startTransfer(op, *groups_.rail, myRail_, false, peer, p.from.back(), tag));
      p.crossing.push_back(startTransfer(op, *groups_.rail, myRail_, true, peer, p.wide.narrow(0, h * p.len, p.len), tag));
    }
  };
  pieces.reserve((n + chunk - 1) / chunk);
  try {
    for (int64_t off = 0; off < n; off += chunk) {
      Piece p;
      p.off = off;
      p.len = std::min(chunk, n - off);
      p.packed = packed.narrow(0, L * H * off, L * H * p.len);
      p.part = parts.narrow(0, H * off, H * p.len);
      for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h)
          p.packed.narrow(0, (l * H + h) * p.len, p.len).copy_(blocks[ranksOf[h][l]].narrow(0, off, p.len));
      checkUsable(op);
      p.reduced = groups_.local->_reduce_scatter_base(p.part, p.packed, legs::reduceScatterOpts(redOp));
      pieces.push_back(std::move(p));
      if (pieces.size() > 1) cross(pieces[pieces.size() - 2]);
    }
    cross(pieces.back());
    for (auto& p : pieces) {
      for (auto& w : p.crossing) waitAcross(op, myRail_, w);
      std::vector<const void*> srcs;
      for (auto& t : p.from) srcs.push_back(t.data_ptr());
      at::Tensor mine = p.from[host_];  // reduceInto's destination may alias a source
      reduceInto(mine.data_ptr(), srcs.data(), static_cast<int>(H), p.len, wideType, redOp);
      finishReduction(mine, redOp, factor);
      out.narrow(0, p.off, p.len).copy_(mine);
    }
  } catch (...) {
    // gloo may still be writing into `arrived`: let the transfers end before it is freed.
    for (auto& p : pieces) legs::drain(p.crossing);
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> MultiHostGroup::allreduce(std::vector<at::Tensor>& tensors,
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
    agreeOnRail("all_reduce", reductionSignature(c10d::OpType::ALLREDUCE, s.work, op));
    allreduceFlat("all_reduce", reducible(s.work).view(-1), op, factor);
    s.writeBack();
  }, !opts.asyncOp);
}

// The same steps as on one host (sparse_allreduce.h), over this group's all_gather. The first
// gather (the fixed-size header) agrees across hosts first, like every collective here; the
// later ones take their sizes from the headers every rank has checked, so they agree already.
c10::intrusive_ptr<c10d::Work> MultiHostGroup::allreduceSparse(const at::Tensor& t, RedOp op) {
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

c10::intrusive_ptr<c10d::Work> MultiHostGroup::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                   const c10d::AllreduceCoalescedOptions& opts) {
  if (auto w = viaHost("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors, tensors,
                       [this, opts](const Tensors&, const Tensors& outs) {
                         Tensors v = outs;
                         return allreduce_coalesced(v, opts);
                       }))
    return *w;
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "allreduce_coalesced");
  std::vector<Staged> staged;
  for (auto& t : tensors) {
    checkHostTensor(t, "allreduce_coalesced", rank_);
    checkReduceArgs(t, op, "allreduce_coalesced", rank_);
    staged.emplace_back(t);
  }
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, staged, op, factor] {
    for (const auto& s : staged) {
      agreeOnRail("allreduce_coalesced", reductionSignature(c10d::OpType::ALLREDUCE_COALESCED, s.work, op));
      allreduceFlat("allreduce_coalesced", reducible(s.work).view(-1), op, factor);
      s.writeBack();
    }
  }, !opts.asyncOp);
}

// The root gets the all-reduced value; other ranks keep their input.
c10::intrusive_ptr<c10d::Work> MultiHostGroup::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> MultiHostGroup::reduce_scatter(std::vector<at::Tensor>& outputs,
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

c10::intrusive_ptr<c10d::Work> MultiHostGroup::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
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

c10::intrusive_ptr<c10d::Work> MultiHostGroup::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < outputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

}  // namespace hoccl
