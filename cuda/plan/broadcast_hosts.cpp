// broadcast and scatter across hosts (PlanRequest::hostOf names more than one host), in messages
// of at most req.netChunkBytes.
//
// broadcast: the root sends the whole tensor to one rank of every other host, its entry: the
// root's rail peer there (HostView::railPeer), straight into the entry's output ((H-1) x bytes
// cross). Inside the root's host the root hands the data to its peers through its staging slot;
// inside every other host the entry does, in rounds that wait only for the chunks they stage, so
// a host's rounds run while later chunks still cross.
//
// scatter: the root sends each rank of another host its block, straight into that rank's output
// (each block crosses once, and no other host stages anything: a relay through one rank per host
// would carry every block of its host on one stream and then copy it twice more); inside the
// root's host the root hands the blocks out through its staging slot.
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
  return p;
}

Plan planScatterHosts(const PlanRequest& req) {
  Plan p;
  p.algo = "scatter/hosts";
  const HostView hv(req);
  const int me = req.rank, root = req.root, rootHost = hv.host(root);
  const int64_t n = req.bytes, chunk = netChunk(req, n);
  Incoming incoming;
  std::vector<int> sends;
  if (n > 0 && me == root) {
    p.steps.push_back(Step::copy(Loc::out(0, 0), Loc::in(root, 0), n));
    for (int t = 0; t < req.world; ++t) {
      if (hv.host(t) == rootHost) continue;
      auto ts = sendChunks(p, t, Loc::in(t, 0), n, chunk);
      sends.insert(sends.end(), ts.begin(), ts.end());
    }
  } else if (n > 0 && hv.host(me) != rootHost) {
    incoming = recvChunks(p, root, Loc::out(0, 0), n, chunk);
  }
  std::vector<SharedPiece> pieces;  // the root's host: each peer's block, from the root
  for (int t : hv.ranksOf[rootHost])
    if (t != root) pieces.push_back({root, Loc::in(t, 0), {{t, Loc::out(0, 0)}}});
  if (hv.host(me) == rootHost) shareThroughSlots(p, req, pieces, n, nullptr);
  incoming.waitAll(p);
  p.waitAll(sends);
  ensureClosingHostBarrier(p);
  return p;
}

}  // namespace hoccl
