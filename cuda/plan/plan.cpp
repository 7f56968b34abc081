#include "plan/plan.h"

#include <sstream>
#include <stdexcept>

namespace hoccl {

const char* opKindName(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::Gather: return "gather";
    case OpKind::Scatter: return "scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::Barrier: return "barrier";
  }
  return "?";
}

int Plan::barriers() const {
  int n = 0;
  for (const auto& s : steps) n += s.kind == Step::Kind::Barrier;
  return n;
}

bool Plan::readsPeers() const {
  for (const auto& s : steps) {
    if (s.src.remote()) return true;
    for (const auto& l : s.srcs)
      if (l.remote()) return true;
  }
  return false;
}

static std::string locStr(const Loc& l) {
  std::ostringstream os;
  if (l.space == Space::In) os << "in[" << l.index << "]+" << l.offset;
  else if (l.space == Space::Out) os << "out[" << l.index << "]+" << l.offset;
  else if (l.space == Space::Slot) os << "slot[r" << l.index << ",b" << l.buf << "]+" << l.offset;
  else os << (l.space == Space::PeerIn ? "peer_in[r" : "peer_out[r") << l.buf << "," << l.index << "]+" << l.offset;
  return os.str();
}

std::string Plan::describe() const {
  std::ostringstream os;
  os << "plan " << algo << ": " << steps.size() << " steps, " << barriers() << " barriers, "
     << buffersUsed << " buffers\n";
  for (const auto& s : steps) {
    if (s.kind == Step::Kind::Barrier) os << "  barrier\n";
    else if (s.kind == Step::Kind::Copy)
      os << "  copy " << locStr(s.dst) << " <- " << locStr(s.src) << " " << s.bytes << "B\n";
    else {
      os << "  reduce " << locStr(s.dst) << " <-";
      for (const auto& l : s.srcs) os << " " << locStr(l);
      os << " x" << s.count << (s.finalize ? " finalize" : "") << "\n";
    }
  }
  return os.str();
}

bool readsPeersDirectly(const PlanRequest& req) {
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
