// Helpers the data-movement builders across hosts share (plan/allgather_hosts.cpp,
// plan/broadcast_hosts.cpp): chunked point-to-point streams across hosts, and the staged hand-off
// of byte ranges to the other ranks of this host through staging slots.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "common/host_view.h"
#include "plan/plan_util.h"

namespace hoccl {

// Every plan has a barrier (it carries the op descriptors); across hosts it is host-scoped.
inline void ensureHostBarrier(Plan& p) {
  if (p.barriers() == 0) p.steps.insert(p.steps.begin(), Step::barrier(Scope::Host));
}

// The same, last: for a host whose ranks only send to or receive from the root's host (gather,
// scatter), which then post their transfers at once instead of waiting for the host's last rank
// (late when its agreement across hosts waited for the root's previous op to drain).
inline void ensureClosingHostBarrier(Plan& p) {
  if (p.barriers() == 0) p.steps.push_back(Step::barrier(Scope::Host));
}

// The largest message a pipelined builder sends at once: req.netChunkBytes rounded down to whole
// elements, or the whole payload when unlimited.
inline int64_t netChunk(const PlanRequest& req, int64_t total) {
  if (req.netChunkBytes > 0) return chunkCapacity(req.netChunkBytes, req.elemSize);
  return std::max<int64_t>(1, total);
}

// The chunks of one stream received from a peer, waited for in order as the plan needs them.
struct Incoming {
  std::vector<std::pair<int64_t, int>> chunks;  // (offset in the stream, transfer)
  size_t next = 0;
  // Waits for every chunk that starts before `end`.
  void waitUpTo(Plan& p, int64_t end) {
    while (next < chunks.size() && chunks[next].first < end) p.wait(chunks[next++].second);
  }
  void waitAll(Plan& p) { waitUpTo(p, INT64_MAX); }
};

// Posts `bytes` from `src` to `peer` in messages of at most `chunk` bytes; returns the transfers.
inline std::vector<int> sendChunks(Plan& p, int peer, Loc src, int64_t bytes, int64_t chunk) {
  std::vector<int> ts;
  forEachChunk(bytes, chunk, [&](int64_t off, int64_t n) {
    Loc at = src;
    at.offset += off;
    ts.push_back(p.send(peer, at, n));
  });
  return ts;
}

// Posts the receives matching sendChunks on the peer.
inline Incoming recvChunks(Plan& p, int peer, Loc dst, int64_t bytes, int64_t chunk) {
  Incoming in;
  forEachChunk(bytes, chunk, [&](int64_t off, int64_t n) {
    Loc at = dst;
    at.offset += off;
    in.chunks.emplace_back(off, p.recv(peer, at, n));
  });
  return in;
}

// A byte range of `bytes` (the same for every piece of one hand-off) that rank `owner` hands to
// other ranks of its host: the owner stages it from `src` (a location of its own), readers copy it
// to their `dst`. Only the owner's plan uses `src`, only a reader's plan its own `dst`.
struct SharedPiece {
  int owner;
  Loc src;
  std::vector<std::pair<int, Loc>> readers;  // (rank on the owner's host, where it lands there)
};

// The staging layout of a hand-off: each piece's place among its owner's pieces, how many of
// an owner's pieces share one round (all of them, unless the slot cannot hold an element of
// each), and the bytes of a piece one round stages (0: nothing to hand on).
struct SlotLayout {
  std::vector<int64_t> index;
  int64_t perRound = 1, batches = 0, part = 0;
};

inline SlotLayout slotLayout(const PlanRequest& req, const std::vector<SharedPiece>& pieces, int64_t bytes) {
  SlotLayout l;
  l.index.assign(pieces.size(), 0);
  std::vector<int64_t> perOwner(req.world, 0);
  int64_t most = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].readers.empty()) continue;
    l.index[i] = perOwner[pieces[i].owner]++;
    most = std::max(most, perOwner[pieces[i].owner]);
  }
  if (most == 0 || bytes == 0) return l;
  l.perRound = std::min(most, std::max<int64_t>(1, req.slotBytes / req.elemSize));
  l.batches = (most + l.perRound - 1) / l.perRound;
  l.part = chunkCapacity(req.slotBytes / l.perRound, req.elemSize);
  return l;
}

// Hands `pieces` (every piece of this host, the same list on every rank of the host) to their
// readers through staging slots, in rounds: each owner stages a chunk of each of its pieces, in
// list order, into its slot, one host barrier, readers copy out. beforeStage(i, end) runs on the
// owner before it stages piece i up to offset `end` (waits for bytes still arriving). No piece
// with readers: no rounds, no barriers.
inline void shareThroughSlots(Plan& p, const PlanRequest& req, const std::vector<SharedPiece>& pieces,
                              int64_t bytes, const std::function<void(size_t, int64_t)>& beforeStage) {
  const SlotLayout l = slotLayout(req, pieces, bytes);
  if (l.part == 0) return;
  forEachChunk(bytes, l.part, [&](int64_t off, int64_t n) {
    for (int64_t batch = 0; batch < l.batches; ++batch) {
      const int b = p.buffersUsed++;
      auto inBatch = [&](size_t i) { return !pieces[i].readers.empty() && l.index[i] / l.perRound == batch; };
      auto slotAt = [&](size_t i) { return (l.index[i] % l.perRound) * l.part; };
      for (size_t i = 0; i < pieces.size(); ++i) {
        const SharedPiece& s = pieces[i];
        if (s.owner != req.rank || !inBatch(i)) continue;
        if (beforeStage) beforeStage(i, off + n);
        Loc src = s.src;
        src.offset += off;
        p.steps.push_back(Step::copy(Loc::slot(s.owner, b, slotAt(i)), src, n));
      }
      p.steps.push_back(Step::barrier(Scope::Host));
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!inBatch(i)) continue;
        for (const auto& [reader, dst] : pieces[i].readers) {
          if (reader != req.rank) continue;
          Loc at = dst;
          at.offset += off;
          p.steps.push_back(Step::copy(at, Loc::slot(pieces[i].owner, b, slotAt(i)), n));
        }
      }
    }
  });
}
}  // namespace hoccl
