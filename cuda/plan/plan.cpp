#include "plan/plan.h"

#include <stdexcept>

namespace hoccl {

bool readsPeersDirectly(const PlanRequest& req) {
  if (req.onCopyEngine) return copyEngineReadsInPlace(req);
  if (!req.crossMemory || req.world == 1 || req.kind == OpKind::Barrier) return false;
  // all_reduce reads every byte twice across processes (reduce-scatter, then all-gather). While
  // the group's data fits the cache, direct reads win (one copy per byte); beyond it
  // process_vm_readv's per-page cost (~60 % of memcpy speed) makes staging plus streaming
  // copies out faster (measured on a 2-core VM: docs/benchmarks.md).
  // Mapped reads of shared tensors run at memcpy speed, so that limit does not apply to them.
  if (req.kind == OpKind::AllReduce && req.bytes * req.world >= req.allReduceDirectReadMaxBytes &&
      !req.everyTensorShared)
    return false;
  return req.bytes >= req.crossMemoryMinBytes;
}

bool allReduceChoosesAfterPublishing(const PlanRequest& req) {
  return req.kind == OpKind::AllReduce && req.crossMemory && req.world > 1 &&
         req.bytes >= req.crossMemoryMinBytes && req.bytes * req.world >= req.allReduceDirectReadMaxBytes;
}

Plan buildPlan(const PlanRequest& req) {
  if (req.acrossHosts()) return buildPlanAcrossHosts(req);
  if (req.onCopyEngine) return buildCopyEnginePlan(req);
  if (readsPeersDirectly(req))
    return req.kind == OpKind::AllToAll ? planAllToAllDirectRead(req) : planDirectRead(req);
  switch (req.kind) {
    case OpKind::AllReduce:
      return req.bytes <= req.oneShotMaxBytes || req.world == 1 ? planAllReduceOneShot(req)
                                                                : planAllReduceRsAg(req);
    case OpKind::AllGather: return planAllGather(req, false);
    case OpKind::Gather: return planAllGather(req, true);
    case OpKind::Broadcast: return planBroadcast(req);
    case OpKind::Scatter: return planScatter(req);
    case OpKind::Reduce: return planReduce(req);
    case OpKind::ReduceScatter: return planReduceScatter(req);
    case OpKind::AllToAll: return planAllToAll(req);
    case OpKind::Barrier: {
      Plan p;
      p.algo = "barrier";
      p.steps.push_back(Step::barrier());
      return p;
    }
  }
  throw std::logic_error("hoccl: unknown op kind");
}

}  // namespace hoccl
