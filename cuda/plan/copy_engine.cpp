// The choice rule for plans on the copy-engine executor (transport/ce, CUDA tensors), the branch
// buildPlan takes for a request with onCopyEngine set. Every rank of a group passes the same
// request but `rank` (everyPeerMapped is agreed group-wide when the group is created), so all
// ranks pick plans of the same shape and their stream barriers stay in lockstep.
//
// Staged (pinned host slots): the same plans the CPU executor runs. all_reduce: one-shot (one
// barrier) within one slot, or on two ranks; past one slot on more than two ranks
// reduce-scatter + all-gather, so each rank copies ~2x the bytes up instead of W x.
// Every peer mapped (the p2p path): the direct-read plans, one D2D per block out of the peer's
// mapped buffer. all_reduce keeps the staged one-shot plan up to one slot (one barrier where
// direct reads need three) and reads peers' slices past it (~2x the bytes over the peer links,
// no host round trip).
#include <stdexcept>
#include <string>

#include "plan/plan.h"

namespace hoccl {

bool copyEngineReadsInPlace(const PlanRequest& req) {
  if (!req.everyPeerMapped || req.world == 1) return false;
  switch (req.kind) {
    case OpKind::AllGather:
    case OpKind::Broadcast:
    case OpKind::AllToAll: return true;
    case OpKind::AllReduce: return req.bytes > req.slotBytes;
    default: return false;
  }
}

Plan buildCopyEnginePlan(const PlanRequest& req) {
  const bool inPlace = copyEngineReadsInPlace(req);
  switch (req.kind) {
    case OpKind::AllGather: return inPlace ? planDirectRead(req) : planAllGather(req, false);
    case OpKind::Broadcast: return inPlace ? planDirectRead(req) : planBroadcast(req);
    case OpKind::AllToAll: return inPlace ? planAllToAllDirectRead(req) : planAllToAll(req);
    case OpKind::AllReduce:
      if (inPlace) return planDirectRead(req);
      return req.world > 2 && req.bytes > req.slotBytes ? planAllReduceRsAg(req) : planAllReduceOneShot(req);
    default:
      throw std::invalid_argument(std::string("hoccl: the copy-engine path has no plan for ") + opKindName(req.kind));
  }
}

}  // namespace hoccl
