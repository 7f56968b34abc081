// broadcast and scatter across hosts (PlanRequest::hostOf names more than one host).
//
// The root sends, in messages of at most req.netChunkBytes, to one rank of every other host, its
// entry: the root's rail peer there (HostView::railPeer). Inside the root's host the root hands
// the data to its peers through its staging slot; inside every other host the entry does, in
// rounds that wait only for the chunks they stage, so a host's rounds run while later chunks
// still cross.
//  broadcast: the whole tensor crosses to each other host once ((H-1) x bytes), straight into
//             the entry's output.
//  scatter:   only the blocks a host needs cross to it, in its rank order: the entry's own
//             straight into its output, the others into its scratch (each block crosses once).
#include "plan/host_share.h"

namespace hoccl {
namespace {

// The rank of `host` the root sends to.
int entryOf(const HostView& hv, int root, int host) {
  return host == hv.host(root) ? root : hv.railPeer(host, hv.localIndex[root]);
}

}  // namespace

Plan planBroadcastHosts(const PlanRequest& req) {
  Plan p;
  p.algo = "broadcast/hosts";
  const HostView hv(req);
  const int me = req.rank, root = req.root, host = hv.host(me), entry = entryOf(hv, root, host);
  const int64_t n = req.bytes, chunk = netChunk(req, n);
  Incoming incoming;
  std::vector<int> sends;
  if (n > 0 && me == root) {
    for (int h = 0; h < hv.hosts(); ++h)
      if (h != host) {
        auto ts = sendChunks(p, entryOf(hv, root, h), Loc::in(0, 0), n, chunk);
        sends.insert(sends.end(), ts.begin(), ts.end());
      }
  } else if (n > 0 && me == entry) {
    incoming = recvChunks(p, root, Loc::out(0, 0), n, chunk);
  }
  // Inside a host: its entry hands the tensor to the others.
  auto piecesOf = [&](int h) {
    const int e = entryOf(hv, root, h);
    SharedPiece piece{e, e == root ? Loc::in(0, 0) : Loc::out(0, 0), {}};
    for (int t : hv.ranksOf[h])
      if (t != e) piece.readers.push_back({t, Loc::out(0, 0)});
    return std::vector<SharedPiece>{piece};
  };
  shareThroughSlots(p, req, piecesOf(host), n, [&](size_t, int64_t end) { incoming.waitUpTo(p, end); });
  incoming.waitAll(p);
  p.waitAll(sends);
  ensureHostBarrier(p);
  agreeOnBuffers(p, mostSlotRounds(req, hv, n, piecesOf));
  return p;
}

Plan planScatterHosts(const PlanRequest& req) {
  Plan p;
  p.algo = "scatter/hosts";
  const HostView hv(req);
  const int me = req.rank, root = req.root, host = hv.host(me), entry = entryOf(hv, root, host);
  const int64_t n = req.bytes, chunk = netChunk(req, n);
  const std::vector<int>& mine = hv.ranksOf[host];
  std::vector<Incoming> incoming(req.world);  // at the entry: per rank of its host
  std::vector<int> sends;
  std::vector<int64_t> scratchAt(req.world, 0);
  if (n > 0 && me == root) {
    p.steps.push_back(Step::copy(Loc::out(0, 0), Loc::in(root, 0), n));
    for (int h = 0; h < hv.hosts(); ++h) {
      if (h == host) continue;
      for (int t : hv.ranksOf[h]) {
        auto ts = sendChunks(p, entryOf(hv, root, h), Loc::in(t, 0), n, chunk);
        sends.insert(sends.end(), ts.begin(), ts.end());
      }
    }
  } else if (n > 0 && me == entry) {
    for (int t : mine) {
      if (t != me) scratchAt[t] = p.reserveScratch(n);
      incoming[t] = recvChunks(p, root, t == me ? Loc::out(0, 0) : Loc::scratch(scratchAt[t]), n, chunk);
    }
  }
  // Inside a host: its entry hands each other rank its block.
  auto piecesOf = [&](int h, std::vector<int>* blocks) {
    const int e = entryOf(hv, root, h);
    std::vector<SharedPiece> pieces;
    for (int t : hv.ranksOf[h]) {
      if (t == e) continue;
      pieces.push_back({e, e == root ? Loc::in(t, 0) : Loc::scratch(scratchAt[t]), {{t, Loc::out(0, 0)}}});
      if (blocks) blocks->push_back(t);
    }
    return pieces;
  };
  std::vector<int> blockOf;
  shareThroughSlots(p, req, piecesOf(host, &blockOf), n,
                    [&](size_t i, int64_t end) { incoming[blockOf[i]].waitUpTo(p, end); });
  for (auto& in : incoming) in.waitAll(p);
  p.waitAll(sends);
  ensureHostBarrier(p);
  agreeOnBuffers(p, mostSlotRounds(req, hv, n, [&](int h) { return piecesOf(h, nullptr); }));
  return p;
}

}  // namespace hoccl
