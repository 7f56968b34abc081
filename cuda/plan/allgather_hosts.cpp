// all_gather and gather across hosts (PlanRequest::hostOf names more than one host).
//
// all_gather: rank r's block crosses to every other host once, point to point from its input
// straight into the output of r's rail peer there (HostView::railPeer: the rank with r's local
// index, modulo the host's size on uneven hosts), in messages of at most req.netChunkBytes. Each
// rank then hands its own block and the blocks it received to the other ranks of its host through
// its staging slot, in rounds that wait only for the chunks they stage, so the host's rounds run
// while later chunks still cross. Every block crosses each host boundary once: (H-1) x bytes per
// rank, the hierarchical minimum. Where the host's ranks read each other's memory
// (hostReadsPeers) and blocks are large, readers copy the blocks straight from their owners'
// inputs and outputs instead, in the same rounds, with nothing staged.
//
// hosts-first (small blocks): the ranks of a host hand each other their blocks through their
// slots (one host barrier), then each rank sends its host's blocks, packed in one message, to the
// ranks of other hosts it stands for (HostView::railPeer), which unpack them. One network hop and
// no host barrier after it, where the rail form waits for the hop, then stages what arrived for
// the rest of the host (a barrier whose ranks the network left out of step). A remote block then
// crosses to every rank of a host, not once per host: (L - 1) x more bytes across hosts, which
// allGatherGoesHostFirst allows only while they cost little against one message.
//
// gather: only the root's outputs are written. Every rank of another host sends its block
// straight into the root's output for it (each block crosses once, into the root's host); the
// root's host peers stage theirs through their slots for the root.
#include "plan/host_share.h"

namespace hoccl {
namespace {

Plan planGatherHosts(const PlanRequest& req) {
  Plan p;
  p.algo = "gather/hosts";
  const HostView hv(req);
  const int me = req.rank, root = req.root, rootHost = hv.host(root);
  const int64_t n = req.bytes, chunk = netChunk(req, n);
  std::vector<Incoming> incoming;
  std::vector<int> sends;
  if (n > 0) {
    if (me == root) {
      for (int r = 0; r < req.world; ++r)
        if (hv.host(r) != rootHost) incoming.push_back(recvChunks(p, r, Loc::out(r, 0), n, chunk));
      p.steps.push_back(Step::copy(Loc::out(root, 0), Loc::in(0, 0), n));
    } else if (hv.host(me) != rootHost) {
      sends = sendChunks(p, root, Loc::in(0, 0), n, chunk);
    }
  }
  std::vector<SharedPiece> pieces;  // the root's host: its peers' blocks, for the root
  for (int q : hv.ranksOf[rootHost])
    if (q != root) pieces.push_back({q, Loc::in(0, 0), {{root, Loc::out(q, 0)}}});
  if (hv.host(me) == rootHost) shareThroughSlots(p, req, pieces, n, nullptr);
  for (auto& in : incoming) in.waitAll(p);
  p.waitAll(sends);
  ensureClosingHostBarrier(p);
  return p;
}

// The readers of block `block` that rank q of host h hands on: every other rank of h, into its
// output for that block.
std::vector<std::pair<int, Loc>> hostReaders(const HostView& hv, int h, int q, int block) {
  std::vector<std::pair<int, Loc>> readers;
  for (int t : hv.ranksOf[h])
    if (t != q) readers.push_back({t, Loc::out(block, 0)});
  return readers;
}

// Each rank of host h hands its own block to the other ranks of h.
std::vector<SharedPiece> ownBlocks(const HostView& hv, int h) {
  std::vector<SharedPiece> pieces;
  for (int q : hv.ranksOf[h]) pieces.push_back({q, Loc::in(0, 0), hostReaders(hv, h, q, q)});
  return pieces;
}

// The rail form hands blocks on by direct reads where this host's ranks read each other's memory
// and blocks are large enough for a read's fixed cost: no staging copies (hostReadsPeers is
// per host, as is the slot cursor).
bool readsHostPeers(const PlanRequest& req, const HostView& hv) {
  return req.hostReadsPeers && hv.localSize(hv.host(req.rank)) > 1 && req.bytes >= req.crossMemoryMinBytes;
}

// Readers copy each piece from its owner's published block: own blocks (inputs) after the first
// barrier, received blocks (outputs) one message's bytes per round, each round after a barrier
// that follows every owner's wait for those bytes (rounds of a slot, four messages, left 5-10 %
// of a 16 MiB block's time waiting on this VM). A last barrier keeps each owner's outputs in place
// until its readers are done.
void readHostPieces(Plan& p, const PlanRequest& req, const std::vector<SharedPiece>& pieces,
                    const std::vector<int>& blockOf, std::vector<Incoming>& incoming) {
  const int64_t n = req.bytes, round = netChunk(req, n);
  auto readsFrom = [&](size_t i) {
    for (const auto& [reader, dst] : pieces[i].readers)
      if (reader == req.rank) return true;
    return false;
  };
  p.steps.push_back(Step::barrier(Scope::Host));
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].src.space == Space::In && readsFrom(i))
      p.steps.push_back(Step::copy(Loc::out(blockOf[i], 0), Loc::peerIn(pieces[i].owner, 0, 0), n));
  forEachChunk(n, round, [&](int64_t off, int64_t len) {
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i].owner == req.rank && pieces[i].src.space == Space::Out) incoming[blockOf[i]].waitUpTo(p, off + len);
    p.steps.push_back(Step::barrier(Scope::Host));
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i].src.space == Space::Out && readsFrom(i))
        p.steps.push_back(Step::copy(Loc::out(blockOf[i], off), Loc::peerOut(pieces[i].owner, blockOf[i], off), len));
  });
  p.steps.push_back(Step::barrier(Scope::Host));
}

}  // namespace

Plan planAllGatherHostFirst(const PlanRequest& req) {
  Plan p;
  p.algo = "allgather/hosts-first";
  const HostView hv(req);
  const int me = req.rank, host = hv.host(me);
  const int64_t n = req.bytes;
  // From each other host, the rank that stands for me there: that host's blocks in rank order.
  struct Arrival {
    int host;
    int64_t at;
    int transfer;
  };
  std::vector<Arrival> arrivals;
  if (n > 0) {
    for (int h = 0; h < hv.hosts(); ++h) {
      if (h == host) continue;
      const int64_t bytes = hv.localSize(h) * n;
      const int64_t at = p.reserveScratch(bytes);
      arrivals.push_back({h, at, p.recv(hv.railPeer(h, hv.localIndex[me]), Loc::scratch(at), bytes)});
    }
    p.steps.push_back(Step::copy(Loc::out(me, 0), Loc::in(0, 0), n));
  }
  shareThroughSlots(p, req, ownBlocks(hv, host), n, nullptr);
  std::vector<int> sends;
  std::vector<int> served;
  for (int r = 0; r < req.world; ++r)
    if (hv.host(r) != host && hv.railPeer(host, hv.localIndex[r]) == me) served.push_back(r);
  if (n > 0 && !served.empty()) {
    const std::vector<int>& local = hv.ranksOf[host];
    const int64_t packed = p.reserveScratch(static_cast<int64_t>(local.size()) * n);
    for (size_t i = 0; i < local.size(); ++i)
      p.steps.push_back(Step::copy(Loc::scratch(packed + static_cast<int64_t>(i) * n), Loc::out(local[i], 0), n));
    for (int r : served) sends.push_back(p.send(r, Loc::scratch(packed), static_cast<int64_t>(local.size()) * n));
  }
  for (const Arrival& a : arrivals) {
    p.wait(a.transfer);
    int64_t off = a.at;
    for (int q : hv.ranksOf[a.host]) {
      p.steps.push_back(Step::copy(Loc::out(q, 0), Loc::scratch(off), n));
      off += n;
    }
  }
  p.waitAll(sends);
  ensureHostBarrier(p);
  return p;
}

// Host first while the bytes it adds across hosts ((L - 1) x the rail form's, L the most ranks
// on a host) take less than a tenth of one message's cost on the link: below that the rail form's
// barrier after the network costs more than the bytes host first adds. Costs and layout are the
// same on every rank, so every rank picks the same form.
bool allGatherGoesHostFirst(const PlanRequest& req) {
  const HostView hv(req);
  const double most = static_cast<double>(hv.rails.size());  // one rail per local index of the widest host
  const double extra = (most - 1) * static_cast<double>(req.bytes) * (hv.hosts() - 1);
  return extra < 0.1 * req.netCosts.messageSec * req.netCosts.linkBytesPerSec;
}

Plan planAllGatherHosts(const PlanRequest& req, bool onlyRoot) {
  if (onlyRoot) return planGatherHosts(req);
  return allGatherGoesHostFirst(req) ? planAllGatherHostFirst(req) : planAllGatherRail(req);
}

Plan planAllGatherRail(const PlanRequest& req) {
  Plan p;
  p.algo = "allgather/hosts";
  const HostView hv(req);
  const int me = req.rank, host = hv.host(me);
  const int64_t n = req.bytes, chunk = netChunk(req, n);
  // The rank of `host` that receives r's block from across hosts (r on another host).
  auto receiverOf = [&](int r) { return hv.railPeer(host, hv.localIndex[r]); };
  std::vector<Incoming> incoming(req.world);
  std::vector<int> sends;
  if (n > 0) {
    for (int r = 0; r < req.world; ++r)
      if (hv.host(r) != host && receiverOf(r) == me) incoming[r] = recvChunks(p, r, Loc::out(r, 0), n, chunk);
    for (int h = 0; h < hv.hosts(); ++h)
      if (h != host) {
        auto ts = sendChunks(p, hv.railPeer(h, hv.localIndex[me]), Loc::in(0, 0), n, chunk);
        sends.insert(sends.end(), ts.begin(), ts.end());
      }
    p.steps.push_back(Step::copy(Loc::out(me, 0), Loc::in(0, 0), n));
  }
  // Inside a host: each rank hands on its own block, then those it received, in rank order.
  std::vector<int> blockOf;  // per piece of this host: the block it carries
  auto piecesOf = [&](int h, std::vector<int>* blocks) {
    std::vector<SharedPiece> pieces;
    for (int q : hv.ranksOf[h]) {
      pieces.push_back({q, Loc::in(0, 0), hostReaders(hv, h, q, q)});
      if (blocks) blocks->push_back(q);
      for (int r = 0; r < req.world; ++r) {
        if (hv.host(r) == h || hv.railPeer(h, hv.localIndex[r]) != q) continue;
        pieces.push_back({q, Loc::out(r, 0), hostReaders(hv, h, q, r)});
        if (blocks) blocks->push_back(r);
      }
    }
    return pieces;
  };
  const std::vector<SharedPiece> pieces = piecesOf(host, &blockOf);
  if (readsHostPeers(req, hv)) readHostPieces(p, req, pieces, blockOf, incoming);
  else shareThroughSlots(p, req, pieces, n, [&](size_t i, int64_t end) { incoming[blockOf[i]].waitUpTo(p, end); });
  for (auto& in : incoming) in.waitAll(p);
  p.waitAll(sends);
  ensureHostBarrier(p);
  return p;
}

}  // namespace hoccl
