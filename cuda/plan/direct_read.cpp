// Single-copy plans: ranks publish their buffer addresses with the first barrier and read what
// they need directly from their peers' memory (process_vm_readv), so each byte crosses memory
// once instead of twice (staging in + staging out). A final barrier keeps every buffer alive
// until all its readers are done. Used for payloads at or above HOCCL_CMA_MIN_BYTES.
#include "plan/plan.h"
#include "plan/plan_util.h"

namespace hoccl {
namespace {

// dst = reduce over ranks (in rank order) of block `block` of every rank's input, elements [lo, hi).
Step reduceFromAllInputs(const PlanRequest& req, Loc dst, int block, int64_t lo, int64_t hi) {
  std::vector<Loc> srcs;
  for (int r = 0; r < req.world; ++r)
    srcs.push_back(r == req.rank ? Loc::in(block, lo * req.elemSize) : Loc::peerIn(r, block, lo * req.elemSize));
  return Step::reduce(dst, srcs, hi - lo, true);
}

void allReduce(const PlanRequest& req, Plan& p) {
  // Reduce-scatter by reading every peer's slice of my part, then all-gather the parts.
  const int64_t elems = req.bytes / req.elemSize;
  auto [lo, hi] = balancedRange(elems, req.world, req.rank);
  if (hi > lo) p.steps.push_back(reduceFromAllInputs(req, Loc::out(0, lo * req.elemSize), 0, lo, hi));
  p.steps.push_back(Step::barrier());
  for (int i = 1; i < req.world; ++i) {
    const int r = rankFromMe(req, i);
    auto [a, b] = balancedRange(elems, req.world, r);
    if (b > a)
      p.steps.push_back(Step::copy(Loc::out(0, a * req.elemSize), Loc::peerOut(r, 0, a * req.elemSize),
                                   (b - a) * req.elemSize));
  }
}

}  // namespace

Plan planDirectRead(const PlanRequest& req) {
  Plan p;
  p.algo = std::string(opKindName(req.kind)) + "/direct-read";
  if (!req.addressesPublished) p.steps.push_back(Step::barrier());  // publishes every rank's buffer addresses
  const int64_t n = req.bytes;
  const bool root = req.rank == req.root;
  switch (req.kind) {
    case OpKind::AllReduce:
      allReduce(req, p);
      break;
    case OpKind::AllGather:
    case OpKind::Gather:
      if (req.kind == OpKind::Gather && !root) break;
      for (int i = 0; i < req.world; ++i) {
        const int r = rankFromMe(req, i);
        p.steps.push_back(Step::copy(Loc::out(r, 0), r == req.rank ? Loc::in(0, 0) : Loc::peerIn(r, 0, 0), n));
      }
      break;
    case OpKind::Broadcast:
      if (!root) p.steps.push_back(Step::copy(Loc::out(0, 0), Loc::peerIn(req.root, 0, 0), n));
      break;
    case OpKind::Scatter:
      p.steps.push_back(Step::copy(Loc::out(0, 0), root ? Loc::in(req.rank, 0) : Loc::peerIn(req.root, req.rank, 0), n));
      break;
    case OpKind::Reduce:
      if (root) p.steps.push_back(reduceFromAllInputs(req, Loc::out(0, 0), 0, 0, n / req.elemSize));
      break;
    case OpKind::ReduceScatter: {
      std::vector<Loc> srcs;
      for (int r = 0; r < req.world; ++r)
        srcs.push_back(r == req.rank ? Loc::in(req.rank, 0) : Loc::peerIn(r, req.rank, 0));
      p.steps.push_back(Step::reduce(Loc::out(0, 0), srcs, n / req.elemSize, true));
      break;
    }
    default:
      break;
  }
  p.steps.push_back(Step::barrier());  // nobody returns while a peer may still read its buffers
  return p;
}

// Each receiver pulls, phase by phase, the transfers the schedule assigns to it; a barrier
// separates phases so the schedule's phases do not overlap. The leading barrier publishes the
// buffer addresses (and the split sizes), unless a split exchange of the same op already did.
Plan planAllToAllDirectRead(const PlanRequest& req) {
  Plan p;
  p.algo = "alltoall/direct-read";
  const int W = req.world;
  std::vector<int64_t> cursor(static_cast<size_t>(W) * W, 0);
  if (!req.addressesPublished) p.steps.push_back(Step::barrier());
  bool first = true;
  for (const auto& phase : req.phases) {
    bool any = false;
    for (const auto& t : phase) any = any || (t.bytes > 0 && t.src != t.dst);
    if (any && !first) p.steps.push_back(Step::barrier());
    for (const auto& t : phase) {
      int64_t& moved = cursor[t.src * W + t.dst];
      if (t.dst == req.rank && t.bytes > 0)
        p.steps.push_back(Step::copy(Loc::out(t.src, moved),
                                     t.src == req.rank ? Loc::in(t.dst, moved) : Loc::peerIn(t.src, t.dst, moved),
                                     t.bytes));
      moved += t.bytes;
    }
    if (any) first = false;
  }
  p.steps.push_back(Step::barrier());
  return p;
}

}  // namespace hoccl
