#include "exec/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/reduce_kernels.h"
#include "exec/streaming_copy.h"

#include <stdexcept>

namespace hoccl {
namespace {

double sinceUs(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// A rank as the local transport knows it: plans across hosts name ranks of the whole group.
int Executor::local(int rank, const ExecContext& ctx) const {
  if (!ctx.localIndex) return rank;
  const int r = (*ctx.localIndex)[rank];
  if (r < 0) throw std::logic_error("hoccl: a plan step names rank " + std::to_string(rank) + " of another host");
  return r;
}

char* Executor::resolve(const Loc& loc, const ExecContext& ctx) const {
  switch (loc.space) {
    case Space::In: return ctx.in[loc.index] + loc.offset;
    case Space::Out: return ctx.out[loc.index] + loc.offset;
    case Space::Slot: return transport_.slot(local(loc.index, ctx), (bufCursor_ + loc.buf) & 1) + loc.offset;
    case Space::Scratch: return const_cast<char*>(scratch_.data()) + loc.offset;
    default: return nullptr;  // remote: not addressable here
  }
}

// Index of a peer block in the published tables: inputs first, then outputs.
size_t Executor::publishedIndex(const Loc& loc) const {
  return static_cast<size_t>(loc.index) + (loc.space == Space::PeerOut ? transport_.blocksPerSide() : 0);
}

const char* Executor::mappedPeer(const Loc& loc, size_t bytes, const ExecContext& ctx) {
  return transport_.mapPeerBlock(local(loc.buf, ctx), addressParity_, publishedIndex(loc), loc.offset, bytes);
}

void Executor::readPeer(const Loc& loc, int64_t extraOffset, void* dst, size_t bytes, const ExecContext& ctx) {
  PhaseTimes* times = ctx.times;
  const auto t0 = times ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  transport_.readPeerBlock(local(loc.buf, ctx), addressParity_, publishedIndex(loc), loc.offset + extraOffset, dst, bytes);
  if (times) times->readUs += sinceUs(t0);
}

void Executor::copy(const Step& step, const ExecContext& ctx) {
  char* dst = resolve(step.dst, ctx);
  const char* src = nullptr;
  if (step.src.remote()) {
    src = mappedPeer(step.src, static_cast<size_t>(step.bytes), ctx);
    if (!src) {
      readPeer(step.src, 0, dst, static_cast<size_t>(step.bytes), ctx);
      return;
    }
  } else {
    src = resolve(step.src, ctx);
  }
  if (dst == src) return;
  // The op's outputs are not read again by this op (peers read published outputs only after a
  // barrier, and the sfence in streamingCopy orders the bytes before it): bypass the cache.
  // Short copies stay plain: a streaming store's partial lines cost more than it saves.
  bool streaming = step.dst.space == Space::Out && ctx.streamOutputs && step.bytes >= (64 << 10);
  if (streaming) streamingCopy(dst, src, static_cast<size_t>(step.bytes));
  else std::memcpy(dst, src, static_cast<size_t>(step.bytes));
}

void Executor::reduce(const Step& step, const ExecContext& ctx) {
  char* dst = resolve(step.dst, ctx);
  const int n = static_cast<int>(step.srcs.size());
  const size_t elem = hoccl::elementSize(ctx.dtype);
  const size_t stepBytes = static_cast<size_t>(step.count) * elem;
  // Sources addressable here: local buffers and mapped shared tensors of peers; nullptr for a
  // remote source that only cross-memory reads can reach.
  std::vector<const char*> whole(n);
  bool anyUnmapped = false;
  for (int k = 0; k < n; ++k) {
    const Loc& l = step.srcs[k];
    whole[k] = l.remote() ? mappedPeer(l, stepBytes, ctx) : resolve(l, ctx);
    anyUnmapped = anyUnmapped || !whole[k];
  }
  std::vector<const void*> srcs(whole.begin(), whole.end());
  if (!anyUnmapped) {
    reduceInto(dst, srcs.data(), n, step.count, ctx.dtype, ctx.op);
  } else {
    // Pull remote sources tile by tile into buffers that together stay in a core's L2 (1 MiB
    // on the machines measured), then reduce the tile: the remote bytes are read from memory
    // once. Tiles as large as that allows: each process_vm_readv has a fixed cost of a few
    // microseconds on top of its page pinning (docs/mpi_comparison.md).
    int remotes = 0;
    for (int k = 0; k < n; ++k) remotes += whole[k] == nullptr;
    const int64_t tileBytes = std::max<int64_t>(32 << 10, (256 << 10) / remotes);
    const int64_t tileElems = std::max<int64_t>(1, tileBytes / static_cast<int64_t>(elem));
    tiles_.resize(static_cast<size_t>(n) * tileElems * elem);
    for (int64_t base = 0; base < step.count; base += tileElems) {
      const int64_t len = std::min(tileElems, step.count - base);
      const int64_t off = base * static_cast<int64_t>(elem);
      for (int k = 0; k < n; ++k) {
        const Loc& l = step.srcs[k];
        if (!whole[k]) {
          char* tile = tiles_.data() + static_cast<size_t>(k) * tileElems * elem;
          readPeer(l, off, tile, static_cast<size_t>(len) * elem, ctx);
          srcs[k] = tile;
        } else {
          srcs[k] = whole[k] + off;
        }
      }
      reduceInto(dst + off, srcs.data(), n, len, ctx.dtype, ctx.op);
    }
  }
  if (step.finalize) postScale(dst, step.count, ctx.dtype, ctx.op, ctx.factor,
                                  ctx.localIndex ? static_cast<int>(ctx.localIndex->size()) : transport_.world());
}

void Executor::post(const Step& step, const ExecContext& ctx) {
  if (!ctx.net) throw std::logic_error("hoccl: a plan sends across hosts, but the group has no network transport");
  if (step.kind == Step::Kind::Send)
    handles_[step.transfer] = ctx.net->isend(step.peer, ctx.netTag, resolve(step.src, ctx), static_cast<size_t>(step.bytes));
  else
    handles_[step.transfer] = ctx.net->irecv(step.peer, ctx.netTag, resolve(step.dst, ctx), static_cast<size_t>(step.bytes));
}

void Executor::waitTransfer(const Step& step, const ExecContext& ctx) {
  NetTransport::Handle h = handles_[step.transfer];
  handles_[step.transfer] = -1;
  const int peer = step.peer;
  ctx.net->wait(h, [&](int) {
    if (ctx.checkNet) ctx.checkNet(peer);
  });
}

void Executor::cancelTransfers(const ExecContext& ctx) {
  for (auto& h : handles_) {
    if (h >= 0 && ctx.net) ctx.net->cancel(h);
    h = -1;
  }
}

void Executor::run(const Plan& plan, ExecContext& ctx) {
  if (!plan.crossesHosts()) {
    runSteps(plan, ctx);
    return;
  }
  scratch_.resize(static_cast<size_t>(plan.scratchBytes));
  handles_.assign(static_cast<size_t>(plan.transfers), -1);
  try {
    runSteps(plan, ctx);
  } catch (...) {
    cancelTransfers(ctx);
    throw;
  }
  for (auto h : handles_)
    if (h >= 0) throw std::logic_error("hoccl: plan " + plan.algo + " left a transfer without a Wait");
}

void Executor::runSteps(const Plan& plan, ExecContext& ctx) {
  bool first = !ctx.addressesPublished;
  PhaseTimes* times = ctx.times;
  for (const Step& step : plan.steps) {
    const auto t0 = times ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const double readBefore = times ? times->readUs : 0;
    switch (step.kind) {
      case Step::Kind::Copy:
        copy(step, ctx);
        // Reads of peers are counted by readPeer: only the rest is a copy.
        if (times) times->copyUs += sinceUs(t0) - (times->readUs - readBefore);
        break;
      case Step::Kind::Reduce:
        reduce(step, ctx);
        if (times) times->reduceUs += sinceUs(t0) - (times->readUs - readBefore);
        break;
      case Step::Kind::Send:
      case Step::Kind::Recv: post(step, ctx); break;
      case Step::Kind::Wait:
        waitTransfer(step, ctx);
        if (times) times->netUs += sinceUs(t0);
        break;
      case Step::Kind::Barrier: {
        if (step.scope == Scope::Group && ctx.localIndex)
          throw std::logic_error("hoccl: plan " + plan.algo + " has a group barrier across hosts");
        uint32_t index = ++barriers_;
        if (first) {
          transport_.publishDescriptor(index & 1, ctx.desc);
          transport_.publishBlocks(index & 1, ctx.in, ctx.out);
          addressParity_ = index & 1;
          ctx.addressesPublished = true;
        }
        transport_.barrier(index, ctx.check);
        if (first && ctx.validate) ctx.validate(index & 1);
        first = false;
        if (times) {
          times->barrierUs += sinceUs(t0);
          ++times->barriers;
        }
        break;
      }
    }
  }
  bufCursor_ += static_cast<uint32_t>(plan.buffersUsed);
}

}  // namespace hoccl
