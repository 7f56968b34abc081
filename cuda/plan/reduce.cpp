// Rooted reduce (the staged reduction of plan/allreduce.cpp, root only) and reduce_scatter.
#include "plan/plan.h"
#include "plan/plan_util.h"

namespace hoccl {

Plan planReduce(const PlanRequest& req) { return planStagedReduce(req, true, "reduce/staged"); }

// Each rank stages, per chunk, the part destined to every rank; then reduces its own part
// across all slots. Input is read once and every byte crosses shared memory once.
Plan planReduceScatter(const PlanRequest& req) {
  Plan p;
  p.algo = "reduce_scatter/staged";
  const int64_t part = chunkCapacity(req.slotBytes / req.world, req.elemSize);
  forEachChunk(req.bytes, part, [&](int64_t off, int64_t n) {
    int b = p.buffersUsed++;
    for (int r = 0; r < req.world; ++r)
      p.steps.push_back(Step::copy(Loc::slot(req.rank, b, r * part), Loc::in(r, off), n));
    p.steps.push_back(Step::barrier());
    std::vector<Loc> srcs;
    for (int r = 0; r < req.world; ++r) srcs.push_back(Loc::slot(r, b, req.rank * part));
    p.steps.push_back(Step::reduce(Loc::out(0, off), srcs, n / req.elemSize, true));
  });
  ensureBarrier(p);
  return p;
}

}  // namespace hoccl
