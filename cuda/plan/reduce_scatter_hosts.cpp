// reduce_scatter across hosts. Input block d (req.bytes) of every rank is reduced into rank d's
// output. On every host, block d is reduced by d's rail member there (the rank whose local index
// is d's, modulo the host's size on uneven hosts; on d's own host that is d): it reduces its
// host's inputs of block d into a partial and sends it to d, which reduces every host's partial
// in host order with finalize straight into its output. So each block's host partial crosses
// once to its owner's host: every host sends (W - L_h) x bytes, the hierarchical minimum, and
// every output element is computed by one rank.
//
// Pipeline in chunks of every block: the host's ranks stage chunk j of the blocks other ranks
// reduce (slot region d for block d), barrier B_j, each rank reduces its blocks' chunk j and posts
// the partials, stages chunk j+1, then waits for chunk j-1's partials and finishes it. One host
// barrier per chunk (one in all on a host with one rank); partials live in Scratch,
// double-buffered by chunk parity. Only the last buffer is read after the last barrier.
#include "common/host_view.h"
#include "plan/plan.h"
#include "plan/plan_util.h"

namespace hoccl {

Plan planReduceScatterAcrossHosts(const PlanRequest& req) {
  const HostView hv(req);
  Plan p;
  p.algo = "reduce_scatter/hosts";
  const int W = req.world, H = hv.hosts(), me = req.rank, host = hv.host(me);
  const int L = hv.localSize(host);
  const int64_t es = req.elemSize;
  auto reducer = [&](int h, int d) { return hv.railPeer(h, hv.localIndex[d]); };
  std::vector<int> mine;  // the blocks I reduce on my host, ascending (my own block among them)
  for (int d = 0; d < W; ++d)
    if (reducer(host, d) == me) mine.push_back(d);

  int64_t regionElems = req.slotBytes / W / es;
  if (req.netChunkBytes > 0) regionElems = std::min(regionElems, req.netChunkBytes / es);
  regionElems = std::max<int64_t>(1, regionElems);
  const int64_t regionBytes = regionElems * es;
  const int64_t total = req.bytes / es;
  const int K = static_cast<int>((total + regionElems - 1) / regionElems);
  if (K == 0) {
    p.steps.push_back(Step::barrier(Scope::Host));
    return p;
  }
  p.buffersUsed = K;
  // Per chunk parity: a partial per block I reduce, then one received partial per other host.
  const int nScratch = static_cast<int>(mine.size()) + H - 1;
  int64_t scratch[2] = {0, 0};
  for (int par = 0; par < std::min(K, 2); ++par) scratch[par] = p.reserveScratch(regionBytes * nScratch);
  auto chunkOff = [&](int j) { return j * regionElems * es; };
  auto chunkBytes = [&](int j) { return std::min(regionElems, total - j * regionElems) * es; };
  auto partialLoc = [&](int j, size_t k) {  // k: index of the block in `mine`
    if (L == 1) return Loc::in(mine[k], chunkOff(j));
    return Loc::scratch(scratch[j & 1] + static_cast<int64_t>(k) * regionBytes);
  };
  auto receivedLoc = [&](int j, int h) {
    const int idx = static_cast<int>(mine.size()) + (h < host ? h : h - 1);
    return Loc::scratch(scratch[j & 1] + idx * regionBytes);
  };
  std::vector<std::vector<int>> posted(K);

  auto stage = [&](int j) {
    if (L == 1) return;
    for (int d = 0; d < W; ++d)
      if (reducer(host, d) != me)
        p.steps.push_back(Step::copy(Loc::slot(me, j, d * regionBytes), Loc::in(d, chunkOff(j)), chunkBytes(j)));
  };
  auto partialsAndPost = [&](int j) {
    const int64_t n = chunkBytes(j);
    for (int h = 0; h < H; ++h)
      if (h != host) posted[j].push_back(p.recv(reducer(h, me), receivedLoc(j, h), n));
    for (size_t k = 0; k < mine.size(); ++k) {
      const int d = mine[k];
      if (L > 1) {
        std::vector<Loc> srcs;
        for (int r : hv.ranksOf[host])
          srcs.push_back(r == me ? Loc::in(d, chunkOff(j)) : Loc::slot(r, j, d * regionBytes));
        p.steps.push_back(Step::reduce(partialLoc(j, k), srcs, n / es, false));
      }
      if (d != me) posted[j].push_back(p.send(d, partialLoc(j, k), n));
    }
  };
  auto finish = [&](int j) {
    p.waitAll(posted[j]);
    const size_t own = static_cast<size_t>(std::find(mine.begin(), mine.end(), me) - mine.begin());
    std::vector<Loc> srcs;
    for (int h = 0; h < H; ++h) srcs.push_back(h == host ? partialLoc(j, own) : receivedLoc(j, h));
    p.steps.push_back(Step::reduce(Loc::out(0, chunkOff(j)), srcs, chunkBytes(j) / es, true));
  };

  stage(0);
  p.steps.push_back(Step::barrier(Scope::Host));
  for (int j = 0; j < K; ++j) {
    if (j > 0 && L > 1) p.steps.push_back(Step::barrier(Scope::Host));
    partialsAndPost(j);
    if (j + 1 < K) stage(j + 1);
    if (j >= 1) finish(j - 1);
  }
  finish(K - 1);
  return p;
}

}  // namespace hoccl
