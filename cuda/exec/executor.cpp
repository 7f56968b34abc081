#include "exec/executor.h"

#include <algorithm>
#include <cstring>

#include "exec/streaming_copy.h"

namespace hoccl {

char* Executor::resolve(const Loc& loc, const ExecContext& ctx) const {
  switch (loc.space) {
    case Space::In: return ctx.in[loc.index] + loc.offset;
    case Space::Out: return ctx.out[loc.index] + loc.offset;
    case Space::Slot: return group_.slot(loc.index, (bufCursor_ + loc.buf) & 1) + loc.offset;
    default: return nullptr;  // remote: not addressable here
  }
}

// Index of a peer block in the published tables: inputs first, then outputs.
size_t Executor::publishedIndex(const Loc& loc) const {
  return static_cast<size_t>(loc.index) + (loc.space == Space::PeerOut ? group_.world() : 0);
}

uint64_t Executor::remoteAddress(const Loc& loc) const {
  return group_.blockAddresses(loc.buf, addressParity_)[publishedIndex(loc)] + static_cast<uint64_t>(loc.offset);
}

const char* Executor::mappedPeer(const Loc& loc, size_t bytes) {
  const SharedRegionRef& region = group_.blockRegions(loc.buf, addressParity_)[publishedIndex(loc)];
  return peerMaps_.resolve(group_.pid(loc.buf), region, remoteAddress(loc), bytes);
}

void Executor::publishAddresses(const ExecContext& ctx, uint32_t parity) {
  uint64_t* table = group_.blockAddresses(group_.rank(), parity);
  SharedRegionRef* regions = group_.blockRegions(group_.rank(), parity);
  const size_t w = static_cast<size_t>(group_.world());
  // A block's region is looked up from its first byte: a peer checks that what it reads lies
  // inside the region and otherwise falls back to cross-memory reads.
  for (size_t i = 0; i < ctx.in.size() && i < w; ++i) {
    table[i] = reinterpret_cast<uint64_t>(ctx.in[i]);
    regions[i] = findSharedRegion(ctx.in[i], 1);
  }
  for (size_t i = 0; i < ctx.out.size() && i < w; ++i) {
    table[w + i] = reinterpret_cast<uint64_t>(ctx.out[i]);
    regions[w + i] = findSharedRegion(ctx.out[i], 1);
  }
}

void Executor::copy(const Step& step, const ExecContext& ctx) {
  char* dst = resolve(step.dst, ctx);
  const char* src = nullptr;
  if (step.src.remote()) {
    src = mappedPeer(step.src, static_cast<size_t>(step.bytes));
    if (!src) {
      crossMemoryRead(group_.pid(step.src.buf), dst, remoteAddress(step.src), static_cast<size_t>(step.bytes));
      return;
    }
    PeerMappings::countRead(static_cast<size_t>(step.bytes));
  } else {
    src = resolve(step.src, ctx);
  }
  if (dst == src) return;
  // The op's outputs are not read again by this op (peers read published outputs only after a
  // barrier, and the sfence in streamingCopy orders the bytes before it): bypass the cache.
  bool streaming = step.dst.space == Space::Out && streamingMinBytes_ > 0 && step.bytes >= streamingMinBytes_;
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
    whole[k] = l.remote() ? mappedPeer(l, stepBytes) : resolve(l, ctx);
    if (l.remote() && whole[k]) PeerMappings::countRead(stepBytes);
    anyUnmapped = anyUnmapped || !whole[k];
  }
  std::vector<const void*> srcs(whole.begin(), whole.end());
  if (!anyUnmapped) {
    reduceInto(dst, srcs.data(), n, step.count, ctx.dtype, ctx.op);
  } else {
    // Pull remote sources tile by tile into cache-sized buffers, then reduce the tile: the
    // remote bytes are read from memory once and the staging stays in cache.
    const int64_t tileElems = std::max<int64_t>(1, (32 << 10) / static_cast<int64_t>(elem));
    tiles_.resize(static_cast<size_t>(n) * tileElems * elem);
    for (int64_t base = 0; base < step.count; base += tileElems) {
      const int64_t len = std::min(tileElems, step.count - base);
      const int64_t off = base * static_cast<int64_t>(elem);
      for (int k = 0; k < n; ++k) {
        const Loc& l = step.srcs[k];
        if (!whole[k]) {
          char* tile = tiles_.data() + static_cast<size_t>(k) * tileElems * elem;
          crossMemoryRead(group_.pid(l.buf), tile, remoteAddress(l) + off, static_cast<size_t>(len) * elem);
          srcs[k] = tile;
        } else {
          srcs[k] = whole[k] + off;
        }
      }
      reduceInto(dst + off, srcs.data(), n, len, ctx.dtype, ctx.op);
    }
  }
  if (step.finalize) postScale(dst, step.count, ctx.dtype, ctx.op, ctx.factor, group_.world());
}

void Executor::run(const Plan& plan, ExecContext& ctx) {
  bool first = !ctx.addressesPublished;
  for (const Step& step : plan.steps) {
    switch (step.kind) {
      case Step::Kind::Copy:
        copy(step, ctx);
        break;
      case Step::Kind::Reduce:
        reduce(step, ctx);
        break;
      case Step::Kind::Barrier: {
        uint32_t index = ++barriers_;
        if (first) {
          group_.control(group_.rank()).desc[index & 1] = ctx.desc;
          publishAddresses(ctx, index & 1);
          addressParity_ = index & 1;
          ctx.addressesPublished = true;
        }
        group_.arrive(index);
        group_.waitAll(index, ctx.check);
        if (first && ctx.validate) ctx.validate(index & 1);
        first = false;
        break;
      }
    }
  }
  bufCursor_ += static_cast<uint32_t>(plan.buffersUsed);
}

}  // namespace hoccl
