#include "transport/ce/ce_plan_executor.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/reduce_kernels.h"
#include "transport/ce/kernels/reduce_args.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

CePlanExecutor::CePlanExecutor(CeSync& barrier, const HostStaging& staging, int device, ReduceOn reduceOn,
                               int reduceCtas, uint32_t firstSeq, SyncStream syncStream)
    : barrier_(barrier), staging_(staging), device_(device), syncStream_(std::move(syncStream)),
      bounce_(staging.slotBytes(), device), barrierSeq_(firstSeq) {
  if (staging.slots() != 2) throw std::logic_error("hoccl cuda-ce: plans assume two staging buffers per rank");
  for (int r = 0; r < barrier.world(); ++r)
    if (r != barrier.rank()) peers_.push_back(r);
  if (reduceOn == ReduceOn::Gpu) {
    kernel_ = std::make_unique<ReduceKernel>(device, reduceCtas);
    // A pass reduces at most a slot of 16-bit elements: their float running values take two slots.
    const size_t accBytes = accScratchOffset() ? 2 * staging.slotBytes() : 0;
    scratch_ = std::make_unique<DeviceBuffer>(staging.slotBytes() * (barrier.world() + 1) + accBytes, device);
  }
}

// Only worlds past HOCCL_REDUCE_MAX_SRCS chain launches, so only they need room for running values.
size_t CePlanExecutor::accScratchOffset() const {
  if (barrier_.world() <= HOCCL_REDUCE_MAX_SRCS) return 0;
  return staging_.slotBytes() * static_cast<size_t>(barrier_.world() + 1);
}

CePlanExecutor::Where CePlanExecutor::resolve(const Loc& loc, const CePlanArgs& args, int64_t bytes) const {
  switch (loc.space) {
    case Space::In: return {false, nullptr, args.in.at(loc.index) + loc.offset, false};
    case Space::Out: return {false, nullptr, args.out.at(loc.index) + loc.offset, false};
    case Space::Slot:
      if (loc.offset + bytes > static_cast<int64_t>(staging_.slotBytes()))
        throw std::logic_error("hoccl cuda-ce: a plan step runs past the end of a staging slot");
      return {true, staging_.hostSlot(loc.index, static_cast<int>((bufCursor_ + loc.buf) & 1), loc.offset), 0, false};
    case Space::PeerIn:
    case Space::PeerOut: {
      const auto& blocks = loc.space == Space::PeerIn ? args.peerIn : args.peerOut;
      const size_t r = static_cast<size_t>(loc.buf), i = static_cast<size_t>(loc.index);
      if (r >= blocks.size() || i >= blocks[r].size() || blocks[r][i] == 0)
        throw std::logic_error("hoccl cuda-ce: a plan reads rank " + std::to_string(loc.buf) + "'s " +
                               (loc.space == Space::PeerIn ? "input" : "output") + " block " +
                               std::to_string(loc.index) + ", which was not mapped for this op");
      return {false, nullptr, blocks[r][i] + loc.offset, true};
    }
    case Space::Scratch: break;  // plans across hosts only, which run on the CPU executor
  }
  throw std::logic_error("hoccl cuda-ce: unknown plan location");
}

void CePlanExecutor::deviceCopy(CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t bytes, bool d2d) {
  if (dst == src) return;
  if (d2d) {
    ceCopyAsync(s, dst, src, bytes);
    return;
  }
  // In slot-sized passes; the stream orders each pass's H2D before the next pass's D2H.
  for (size_t off = 0; off < bytes; off += staging_.slotBytes()) {
    const size_t n = std::min(staging_.slotBytes(), bytes - off);
    ceCopyToHost(s, bounce_.hostPtr(), src + off, n);
    ceCopyFromHost(s, dst + off, bounce_.hostPtr(), n);
  }
}

void CePlanExecutor::copy(CUstream s, const Step& step, const CePlanArgs& args) {
  const Where dst = resolve(step.dst, args, step.bytes), src = resolve(step.src, args, step.bytes);
  const size_t bytes = static_cast<size_t>(step.bytes);
  if (dst.remote) throw std::logic_error("hoccl cuda-ce: plans never write into a peer's block");
  if (dst.host && src.host) throw std::logic_error("hoccl cuda-ce: plans never copy slot to slot");
  if (dst.host) ceCopyToHost(s, dst.hostPtr, src.dev, bytes);
  else if (src.host) ceCopyFromHost(s, dst.dev, src.hostPtr, bytes);
  else deviceCopy(s, dst.dev, src.dev, bytes, args.d2d || src.remote);
}

// The stream-ordered signal carries a memory barrier: a peer that sees it also sees this rank's
// earlier copies into its slot.
void CePlanExecutor::barrier(CUstream s) {
  const uint32_t seq = ++barrierSeq_;
  for (int p : peers_) barrier_.signal(s, p, seq);
  if (!peers_.empty()) barrier_.waitMany(s, peers_, std::vector<uint32_t>(peers_.size(), seq));
}

// Staged plans reduce at most one slot per step; a direct-read plan reduces a whole part of the
// tensor in one step, which the scratch space (one slot per source) takes in passes.
void CePlanExecutor::reduce(CUstream s, const Step& step, const CePlanArgs& args) {
  const int64_t elem = static_cast<int64_t>(hoccl::elementSize(args.dtype));
  const int64_t perPass = static_cast<int64_t>(staging_.slotBytes()) / elem;
  for (int64_t done = 0; done < step.count; done += perPass) {
    const int64_t n = std::min(perPass, step.count - done);
    auto at = [&](Loc l) {
      l.offset += done * elem;
      return resolve(l, args, n * elem);
    };
    std::vector<Where> srcs;
    for (const Loc& l : step.srcs) srcs.push_back(at(l));
    const Where dst = at(step.dst);
    if (dst.remote) throw std::logic_error("hoccl cuda-ce: plans never reduce into a peer's block");
    if (kernel_) reduceOnGpu(s, n, step.finalize, dst, srcs, args);
    else reduceOnHost(s, n, step.finalize, dst, srcs, args);
  }
}

// The kernel reads this rank's own device blocks where they are. A peer's block is first copied
// into scratch: the copy engines move data between GPUs, the kernel's SMs never load over the
// peer link. An own block at a source index past the kernel's first launch must not be the
// destination (the chained launches overwrite it), so that one is copied too.
void CePlanExecutor::reduceOnGpu(CUstream s, int64_t count, bool finalize, const Where& dst,
                                 const std::vector<Where>& srcs, const CePlanArgs& args) {
  const size_t bytes = static_cast<size_t>(count) * hoccl::elementSize(args.dtype);
  const size_t slot = staging_.slotBytes();
  std::vector<CUdeviceptr> dev;
  for (size_t k = 0; k < srcs.size(); ++k) {
    const Where& w = srcs[k];
    const CUdeviceptr scratch = scratch_->ptr(k * slot);
    if (w.host) {
      ceCopyFromHost(s, scratch, w.hostPtr, bytes);
      dev.push_back(scratch);
    } else if (w.remote || (!dst.host && w.dev == dst.dev && k >= HOCCL_REDUCE_MAX_SRCS)) {
      deviceCopy(s, scratch, w.dev, bytes, args.d2d || w.remote);
      dev.push_back(scratch);
    } else {
      dev.push_back(w.dev);
    }
  }
  // A slot destination (rs-ag's reduced part) gets the result through the spare scratch slot.
  const CUdeviceptr out = dst.host ? scratch_->ptr(srcs.size() * slot) : dst.dev;
  const size_t acc = accScratchOffset();
  kernel_->launch(s, out, dev, count, args.dtype, args.op, args.factor, barrier_.world(), finalize,
                  acc ? scratch_->ptr(acc) : 0);
  if (dst.host) ceCopyToHost(s, dst.hostPtr, out, bytes);
}

// The CPU reads the slots once the stream is past the barrier that published them; device
// sources (own or peers' blocks) come down by D2H into private pinned scratch first. A slot
// destination is reduced in place (the plans let only this rank touch that range meanwhile); a
// device one through a private buffer, copied up on the stream.
void CePlanExecutor::reduceOnHost(CUstream s, int64_t count, bool finalize, const Where& dst,
                                  const std::vector<Where>& srcs, const CePlanArgs& args) {
  const size_t bytes = static_cast<size_t>(count) * hoccl::elementSize(args.dtype);
  std::vector<const void*> in;
  for (size_t k = 0; k < srcs.size(); ++k) {
    if (srcs[k].host) {
      in.push_back(srcs[k].hostPtr);
      continue;
    }
    if (!hostScratch_) hostScratch_ = std::make_unique<PinnedHostBuffer>(staging_.slotBytes() * barrier_.world(), device_);
    void* h = hostScratch_->hostPtr(k * staging_.slotBytes());
    ceCopyToHost(s, h, srcs[k].dev, bytes);
    in.push_back(h);
  }
  syncStream_(s, "the stream did not reach the host reduction");
  const int world = barrier_.world();
  if (dst.host) {
    reduceInto(dst.hostPtr, in.data(), static_cast<int>(in.size()), count, args.dtype, args.op);
    if (finalize) postScale(dst.hostPtr, count, args.dtype, args.op, args.factor, world);
    return;
  }
  std::vector<char> result(bytes);
  reduceInto(result.data(), in.data(), static_cast<int>(in.size()), count, args.dtype, args.op);
  if (finalize) postScale(result.data(), count, args.dtype, args.op, args.factor, world);
  // Pageable source: the driver stages it before returning, so `result` may go at once.
  cu::check(cu::driver().cuMemcpyHtoDAsync(dst.dev, result.data(), result.size(), s), "cuMemcpyHtoDAsync");
}

void CePlanExecutor::run(CUstream stream, const Plan& plan, const CePlanArgs& args) {
  for (const Step& step : plan.steps) {
    switch (step.kind) {
      case Step::Kind::Copy: copy(stream, step, args); break;
      case Step::Kind::Reduce: reduce(stream, step, args); break;
      case Step::Kind::Barrier: barrier(stream); break;
      // CUDA tensors cross hosts staged through host memory, on the CPU executor.
      case Step::Kind::Send:
      case Step::Kind::Recv:
      case Step::Kind::Wait: throw std::logic_error("hoccl: the copy-engine executor runs plans of one host only");
    }
  }
  bufCursor_ += static_cast<uint32_t>(plan.buffersUsed);
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
