#include "transport/ce/ce_plan_executor.h"

#include <algorithm>
#include <stdexcept>

#include "exec/reduce_kernels.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

CePlanExecutor::CePlanExecutor(CeSync& barrier, const HostStaging& staging, int device, ReduceOn reduceOn,
                               int reduceCtas, uint32_t firstSeq, SyncStream syncStream)
    : barrier_(barrier), staging_(staging), syncStream_(std::move(syncStream)),
      bounce_(staging.slotBytes(), device), barrierSeq_(firstSeq) {
  if (staging.slots() != 2) throw std::logic_error("hoccl cuda-ce: plans assume two staging buffers per rank");
  for (int r = 0; r < barrier.world(); ++r)
    if (r != barrier.rank()) peers_.push_back(r);
  if (reduceOn == ReduceOn::Gpu) {
    kernel_ = std::make_unique<ReduceKernel>(device, reduceCtas);
    scratch_ = std::make_unique<DeviceBuffer>(staging.slotBytes() * (barrier.world() + 1), device);
  }
}

CePlanExecutor::Where CePlanExecutor::resolve(const Loc& loc, const CePlanArgs& args) const {
  switch (loc.space) {
    case Space::In: return {false, nullptr, args.in.at(loc.index) + loc.offset};
    case Space::Out: return {false, nullptr, args.out.at(loc.index) + loc.offset};
    case Space::Slot:
      return {true, staging_.hostSlot(loc.index, static_cast<int>((bufCursor_ + loc.buf) & 1), loc.offset), 0};
    default:
      throw std::logic_error("hoccl cuda-ce: plans that read peers' buffers in place are not supported here");
  }
}

void CePlanExecutor::deviceCopy(CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (dst == src) return;
  // In slot-sized passes; the stream orders each pass's H2D before the next pass's D2H.
  for (size_t off = 0; off < bytes; off += staging_.slotBytes()) {
    const size_t n = std::min(staging_.slotBytes(), bytes - off);
    ceCopyToHost(s, bounce_.hostPtr(), src + off, n);
    ceCopyFromHost(s, dst + off, bounce_.hostPtr(), n);
  }
}

void CePlanExecutor::copy(CUstream s, const Step& step, const CePlanArgs& args) {
  const Where dst = resolve(step.dst, args), src = resolve(step.src, args);
  const size_t bytes = static_cast<size_t>(step.bytes);
  if (dst.host && src.host) throw std::logic_error("hoccl cuda-ce: plans never copy slot to slot");
  if (dst.host) ceCopyToHost(s, dst.hostPtr, src.dev, bytes);
  else if (src.host) ceCopyFromHost(s, dst.dev, src.hostPtr, bytes);
  else deviceCopy(s, dst.dev, src.dev, bytes);
}

// The stream-ordered signal carries a memory barrier: a peer that sees it also sees this rank's
// earlier copies into its slot.
void CePlanExecutor::barrier(CUstream s) {
  const uint32_t seq = ++barrierSeq_;
  for (int p : peers_) barrier_.signal(s, p, seq);
  if (!peers_.empty()) barrier_.waitMany(s, peers_, std::vector<uint32_t>(peers_.size(), seq));
}

void CePlanExecutor::reduce(CUstream s, const Step& step, const CePlanArgs& args) {
  if (static_cast<size_t>(step.count) * hoccl::elementSize(args.dtype) > staging_.slotBytes())
    throw std::logic_error("hoccl cuda-ce: a reduction step larger than a staging slot");
  std::vector<void*> srcs;
  for (const Loc& l : step.srcs) {
    const Where w = resolve(l, args);
    if (!w.host) throw std::logic_error("hoccl cuda-ce: plans reduce staged data only");
    srcs.push_back(w.hostPtr);
  }
  const Where dst = resolve(step.dst, args);
  if (kernel_) reduceOnGpu(s, step, dst, srcs, args);
  else reduceOnHost(s, step, dst, srcs, args);
}

void CePlanExecutor::reduceOnGpu(CUstream s, const Step& step, const Where& dst, const std::vector<void*>& srcs,
                                 const CePlanArgs& args) {
  const size_t bytes = static_cast<size_t>(step.count) * hoccl::elementSize(args.dtype);
  const size_t slot = staging_.slotBytes();
  std::vector<CUdeviceptr> dev;
  for (size_t k = 0; k < srcs.size(); ++k) {
    dev.push_back(scratch_->ptr(k * slot));
    ceCopyFromHost(s, dev.back(), srcs[k], bytes);
  }
  // A slot destination (rs-ag's reduced part) gets the result through the spare scratch slot.
  const CUdeviceptr out = dst.host ? scratch_->ptr(srcs.size() * slot) : dst.dev;
  kernel_->launch(s, out, dev, step.count, args.dtype, args.op, args.factor, barrier_.world(), step.finalize);
  if (dst.host) ceCopyToHost(s, dst.hostPtr, out, bytes);
}

// The CPU reads the slots once the stream is past the barrier that published them. A slot
// destination is reduced in place (the plans let only this rank touch that range meanwhile); a
// device one through a private buffer, copied up on the stream.
void CePlanExecutor::reduceOnHost(CUstream s, const Step& step, const Where& dst, const std::vector<void*>& srcs,
                                  const CePlanArgs& args) {
  syncStream_(s, "the stream did not reach the host reduction");
  std::vector<const void*> in(srcs.begin(), srcs.end());
  const int world = barrier_.world();
  if (dst.host) {
    reduceInto(dst.hostPtr, in.data(), static_cast<int>(in.size()), step.count, args.dtype, args.op);
    if (step.finalize) postScale(dst.hostPtr, step.count, args.dtype, args.op, args.factor, world);
    return;
  }
  std::vector<char> result(static_cast<size_t>(step.count) * hoccl::elementSize(args.dtype));
  reduceInto(result.data(), in.data(), static_cast<int>(in.size()), step.count, args.dtype, args.op);
  if (step.finalize) postScale(result.data(), step.count, args.dtype, args.op, args.factor, world);
  // Pageable source: the driver stages it before returning, so `result` may go at once.
  cu::check(cu::driver().cuMemcpyHtoDAsync(dst.dev, result.data(), result.size(), s), "cuMemcpyHtoDAsync");
}

void CePlanExecutor::run(CUstream stream, const Plan& plan, const CePlanArgs& args) {
  for (const Step& step : plan.steps) {
    switch (step.kind) {
      case Step::Kind::Copy: copy(stream, step, args); break;
      case Step::Kind::Reduce: reduce(stream, step, args); break;
      case Step::Kind::Barrier: barrier(stream); break;
    }
  }
  bufCursor_ += static_cast<uint32_t>(plan.buffersUsed);
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
