// all_reduce plans.
//  one-shot: every rank stages its chunk, one barrier, every rank reduces all slots itself.
//            1 barrier per chunk: lowest latency, W x the reduction reads. For small messages.
//  rs-ag:    reduce-scatter then all-gather through the same slots: each rank stages the parts
//            its peers reduce, barrier, reduces its 1/W of the chunk (its own input and the
//            peers' slots) into its own slot, barrier, everyone copies the W reduced parts out,
//            its own first.
//            2 barriers per chunk, each byte read ~3 times in all: for large messages.
#include "plan/plan.h"
#include "plan/plan_util.h"

namespace hoccl {

// Every rank stages its chunk; after one barrier the reducers (all ranks, or the root only)
// combine every slot. Shared by one-shot all_reduce and rooted reduce.
Plan planStagedReduce(const PlanRequest& req, bool rootOnly, const char* algo) {
  Plan p;
  p.algo = algo;
  forEachChunk(req.bytes, chunkCapacity(req.slotBytes, req.elemSize), [&](int64_t off, int64_t n) {
    int b = p.buffersUsed++;
    p.steps.push_back(Step::copy(Loc::slot(req.rank, b, 0), Loc::in(0, off), n));
    p.steps.push_back(Step::barrier());
    if (rootOnly && req.rank != req.root) return;
    std::vector<Loc> srcs;
    for (int r = 0; r < req.world; ++r) srcs.push_back(Loc::slot(r, b, 0));
    p.steps.push_back(Step::reduce(Loc::out(0, off), srcs, n / req.elemSize, true));
  });
  ensureBarrier(p);
  return p;
}

Plan planAllReduceOneShot(const PlanRequest& req) { return planStagedReduce(req, false, "allreduce/one-shot"); }

Plan planAllReduceRsAg(const PlanRequest& req) {
  Plan p;
  p.algo = "allreduce/rs-ag";
  const int W = req.world;
  forEachChunk(req.bytes, chunkCapacity(req.slotBytes, req.elemSize), [&](int64_t off, int64_t n) {
    int b = p.buffersUsed++;
    const int64_t elems = n / req.elemSize;
    auto [myLo, myHi] = balancedRange(elems, W, req.rank);
    // Only the parts peers reduce are staged: my own part I read from my input (1/W less copying;
    // world 2, 1 MB fp32: ~104 -> ~90 us on the 2-core VM).
    if (myLo > 0) p.steps.push_back(Step::copy(Loc::slot(req.rank, b, 0), Loc::in(0, off), myLo * req.elemSize));
    if (myHi < elems)
      p.steps.push_back(Step::copy(Loc::slot(req.rank, b, myHi * req.elemSize), Loc::in(0, off + myHi * req.elemSize),
                                   (elems - myHi) * req.elemSize));
    p.steps.push_back(Step::barrier());
    // My part, reduced into my own slot (sources in rank order, mine from my input): peers read
    // only their own parts of my slot, and copy mine out after the next barrier.
    if (myHi > myLo) {
      std::vector<Loc> srcs;
      for (int r = 0; r < W; ++r)
        srcs.push_back(r == req.rank ? Loc::in(0, off + myLo * req.elemSize) : Loc::slot(r, b, myLo * req.elemSize));
      p.steps.push_back(Step::reduce(Loc::slot(req.rank, b, myLo * req.elemSize), srcs,
                                     myHi - myLo, true));
    }
    p.steps.push_back(Step::barrier());
    for (int i = 0; i < W; ++i) {  // my own part first: it is in my cache
      const int r = rankFromMe(req, i);
      auto [lo, hi] = balancedRange(elems, W, r);
      if (hi > lo)
        p.steps.push_back(Step::copy(Loc::out(0, off + lo * req.elemSize),
                                     Loc::slot(r, b, lo * req.elemSize), (hi - lo) * req.elemSize));
    }
  });
  ensureBarrier(p);
  return p;
}

}  // namespace hoccl
