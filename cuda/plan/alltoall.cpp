// all_to_all plans from a schedule: a sequence of phases, each a set of (src, dst, bytes).
// The scheduler (direct, pairwise or VarioPath) decides the phases; this file only packs each
// phase into staging rounds: a source's transfers of one phase share its slot, in phase order,
// and a phase larger than a slot takes several rounds. One barrier per round.
#include <map>

#include "plan/plan.h"
#include "plan/plan_util.h"

namespace hoccl {

Plan planAllToAll(const PlanRequest& req) {
  Plan p;
  p.algo = "alltoall/phased";
  const int W = req.world;
  std::vector<int64_t> cursor(static_cast<size_t>(W) * W, 0);  // bytes of (s,d) already moved
  for (const auto& phase : req.phases) {
    std::vector<Transfer3> pending;
    for (const auto& t : phase)
      if (t.src == t.dst) {
        if (t.src == req.rank && t.bytes > 0)
          p.steps.push_back(Step::copy(Loc::out(t.src, cursor[t.src * W + t.dst]),
                                       Loc::in(t.dst, cursor[t.src * W + t.dst]), t.bytes));
        cursor[t.src * W + t.dst] += t.bytes;
      } else if (t.bytes > 0) {
        pending.push_back(t);
      }
    while (!pending.empty()) {
      int b = p.buffersUsed++;
      std::vector<int64_t> fill(W, 0);
      std::vector<Step> reads;
      std::vector<Transfer3> left;
      for (auto t : pending) {
        int64_t take = std::min<int64_t>(t.bytes, req.slotBytes - fill[t.src]);
        if (take > 0) {
          int64_t& moved = cursor[t.src * W + t.dst];
          if (t.src == req.rank)
            p.steps.push_back(Step::copy(Loc::slot(t.src, b, fill[t.src]), Loc::in(t.dst, moved), take));
          if (t.dst == req.rank)
            reads.push_back(Step::copy(Loc::out(t.src, moved), Loc::slot(t.src, b, fill[t.src]), take));
          fill[t.src] += take;
          moved += take;
          t.bytes -= take;
        }
        if (t.bytes > 0) left.push_back(t);
      }
      p.steps.push_back(Step::barrier());
      p.steps.insert(p.steps.end(), reads.begin(), reads.end());
      pending.swap(left);
    }
  }
  ensureBarrier(p);
  return p;
}

}  // namespace hoccl
