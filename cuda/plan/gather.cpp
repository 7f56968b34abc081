// Data-movement plans with no arithmetic: all_gather, gather, broadcast, scatter.
// Each chunk: writers stage into their own slot, one barrier, readers copy out.
#include "plan/plan.h"
#include "plan/plan_util.h"

namespace hoccl {

Plan planAllGather(const PlanRequest& req, bool onlyRoot) {
  Plan p;
  p.algo = onlyRoot ? "gather/staged" : "allgather/staged";
  const bool reader = !onlyRoot || req.rank == req.root;
  if (reader && req.bytes > 0)  // my own block never needs the slot
    p.steps.push_back(Step::copy(Loc::out(req.rank, 0), Loc::in(0, 0), req.bytes));
  forEachChunk(req.bytes, chunkCapacity(req.slotBytes, req.elemSize), [&](int64_t off, int64_t n) {
    int b = p.buffersUsed++;
    const bool writer = !onlyRoot || req.rank != req.root;
    if (writer) p.steps.push_back(Step::copy(Loc::slot(req.rank, b, 0), Loc::in(0, off), n));
    p.steps.push_back(Step::barrier());
    if (!reader) return;
    for (int i = 1; i < req.world; ++i) {
      const int r = rankFromMe(req, i);
      p.steps.push_back(Step::copy(Loc::out(r, off), Loc::slot(r, b, 0), n));
    }
  });
  ensureBarrier(p);
  return p;
}

Plan planBroadcast(const PlanRequest& req) {
  Plan p;
  p.algo = "broadcast/staged";
  const bool root = req.rank == req.root;
  forEachChunk(req.bytes, chunkCapacity(req.slotBytes, req.elemSize), [&](int64_t off, int64_t n) {
    int b = p.buffersUsed++;
    if (root) p.steps.push_back(Step::copy(Loc::slot(req.rank, b, 0), Loc::in(0, off), n));
    p.steps.push_back(Step::barrier());
    if (!root) p.steps.push_back(Step::copy(Loc::out(0, off), Loc::slot(req.root, b, 0), n));
  });
  ensureBarrier(p);
  return p;
}

Plan planScatter(const PlanRequest& req) {
  Plan p;
  p.algo = "scatter/staged";
  const bool root = req.rank == req.root;
  if (root && req.bytes > 0)
    p.steps.push_back(Step::copy(Loc::out(0, 0), Loc::in(req.rank, 0), req.bytes));
  // The root's slot holds one part per rank.
  const int64_t part = chunkCapacity(req.slotBytes / req.world, req.elemSize);
  forEachChunk(req.bytes, part, [&](int64_t off, int64_t n) {
    int b = p.buffersUsed++;
    if (root)
      for (int r = 0; r < req.world; ++r)
        if (r != req.rank) p.steps.push_back(Step::copy(Loc::slot(req.rank, b, r * part), Loc::in(r, off), n));
    p.steps.push_back(Step::barrier());
    if (!root) p.steps.push_back(Step::copy(Loc::out(0, off), Loc::slot(req.root, b, req.rank * part), n));
  });
  ensureBarrier(p);
  return p;
}

}  // namespace hoccl
