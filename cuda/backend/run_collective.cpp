#include "backend/collective.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "transport/shm/futex_wait.h"
#include "transport/shm/shared_tensor.h"

namespace hoccl {

void ProcessGroupHOCCL::checkWait(const Collective& c, int peer) {
  std::string prefix = std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) + ": ";
  if (group_->aborted())
    throw std::runtime_error(prefix + "the group was aborted: " + group_->abortMessage());
  if (std::chrono::steady_clock::now() > c.deadline) {
    std::string msg = prefix + "Timed out after " + std::to_string(timeout_.count()) +
                      " ms waiting for rank " + std::to_string(groupRankOf_[peer]) + " to reach collective #" +
                      std::to_string(c.ctx.desc.opSeq);
    group_->abort(msg);
    throw std::runtime_error(msg);
  }
  try {
    group_->checkAlive(peer, prefix + "waiting for a peer");
  } catch (const std::exception& e) {
    group_->abort(e.what());
    throw;
  }
}

static bool anyRankSawOtherWork(const ShmGroup& group, int size, uint32_t parity) {
  for (int r = 0; r < size; ++r)
    if (group.control(r).desc[parity].coresShared == 2) return true;
  return false;
}

// The descriptor's coresShared: 0 none, 1 shared among ranks (or with other sessions' work), 2
// shared with the job's own compute. A rank yields before it sleeps unless it or, at the group's
// last agreed op, any peer saw the job's compute: a peer's compute threads take this rank's yields
// as readily as its own (one scheduling group), so the group follows its most loaded rank.
void ProcessGroupHOCCL::noteCoreSharing(Collective& c) {
  const CoreSharing sharing = coreSharingNow(config_.waitPolicy);
  lastCoreSharing_.store(sharing, std::memory_order_relaxed);
  const bool otherWork = sharing == CoreSharing::WithOtherWork;
  const bool besideCompute = otherWork || (groupOtherWork_ && sharing != CoreSharing::None);
  const int64_t yieldUs = besideCompute ? config_.sharedYieldMicros : 1000;
  setCoresShared(sharing != CoreSharing::None, std::chrono::microseconds(yieldUs),
                 std::chrono::microseconds(config_.sharedSliceMicros));
  c.ctx.desc.coresShared = otherWork ? 2 : sharing != CoreSharing::None ? 1 : 0;
}

void ProcessGroupHOCCL::validateDescriptors(const Collective& c, uint32_t parity) {
  groupOtherWork_ = anyRankSawOtherWork(*group_, localSize_, parity);
  const OpDesc& mine = c.ctx.desc;
  bool agree = true;  // the common case, checked without building any message
  for (int r = 0; r < localSize_ && agree; ++r) {
    const OpDesc d = group_->control(r).desc[parity];
    agree = d.kind == mine.kind && d.dtype == mine.dtype && d.numel == mine.numel && d.root == mine.root &&
            d.redop == mine.redop && d.opSeq == mine.opSeq;
  }
  if (agree) return;
  std::ostringstream err;
  for (int l = 0; l < localSize_; ++l) {
    const OpDesc d = group_->control(l).desc[parity];
    const int r = groupRankOf_[l];
    if (d.kind != mine.kind)
      err << "; rank " << r << " called " << opKindName(static_cast<OpKind>(d.kind));
    else if (d.dtype != mine.dtype)
      err << "; rank " << r << " passed dtype " << c10::toString(static_cast<c10::ScalarType>(d.dtype))
          << " but rank " << rank_ << " passed " << c10::toString(static_cast<c10::ScalarType>(mine.dtype));
    else if (d.numel != mine.numel)
      err << "; rank " << r << " passed " << d.numel << " elements but rank " << rank_ << " passed "
          << mine.numel;
    else if (d.root != mine.root)
      err << "; rank " << r << " used root " << d.root << " but rank " << rank_ << " used " << mine.root;
    else if (d.redop != mine.redop)
      err << "; rank " << r << " used op " << redOpName(static_cast<RedOp>(d.redop)) << " but rank "
          << rank_ << " used " << redOpName(static_cast<RedOp>(mine.redop));
    else if (d.opSeq != mine.opSeq)
      err << "; rank " << r << " is at collective #" << d.opSeq << " but rank " << rank_ << " is at #"
          << mine.opSeq;
  }
  std::string e = err.str();
  if (!e.empty())
    throw std::invalid_argument(std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) +
                                ": ranks disagree (this rank called " +
                                opKindName(static_cast<OpKind>(mine.kind)) + ")" + e);
}

// The host's split table; the error names the group's ranks.
void ProcessGroupHOCCL::validateSplits(const Collective& c, uint32_t parity) const {
  bool agree = true;  // the common case, checked without building any message
  for (int s = 0; s < localSize_ && agree; ++s)
    for (int d = 0; d < localSize_ && agree; ++d)
      agree = group_->splits(s, parity)[d] == group_->splits(d, parity)[localSize_ + s];
  if (agree) return;
  auto name = [&](int r) { return groupRankOf_[r]; };
  std::ostringstream err;
  for (int s = 0; s < localSize_; ++s)
    for (int d = 0; d < localSize_; ++d) {
      int64_t sent = group_->splits(s, parity)[d];
      int64_t expected = group_->splits(d, parity)[localSize_ + s];
      if (sent != expected)
        err << "; rank " << name(s) << " sends " << sent << " bytes to rank " << name(d) << " but rank " << name(d)
            << " expects " << expected << " bytes from rank " << name(s);
    }
  throw std::invalid_argument(std::string("hoccl ") + c.opName + " on rank " + std::to_string(c.req.rank) +
                              ": split sizes disagree between senders and receivers" + err.str());
}

int64_t ProcessGroupHOCCL::crossMemoryMinBytes(OpKind kind) const {
  if (kind == OpKind::AllReduce) return std::max(config_.crossMemoryMinBytes, config_.allReduceCrossMemoryMinBytes);
  if (kind == OpKind::AllToAll) return config_.allToAllCrossMemoryMinBytes;
  return config_.crossMemoryMinBytes;
}

// One round of the whole slot unless HOCCL_STAGED_ROUND_BYTES says otherwise: every round costs
// barriers, and on shared cores each waits for the last rank to be scheduled again (world 4, 2
// cores, loaded: 1 MiB in 2.5-2.8 instead of 17-23 ms in 128 KiB rounds). On idle cores the
// rounds no longer pay either since rs-ag stopped staging each rank's own part: world 2, groups of
// both kinds taking turns in one job, the whole slot took 0.45-0.51x the time of 128 KiB rounds
// from 512 KiB to 3 MiB while the VM ran fast, 0.83-0.99x while it ran slow, 0.79x and level at
// 256 KiB (docs/benchmarks.md, 2026-12-07). Every rank stages in the same rounds.
int64_t ProcessGroupHOCCL::stagingRoundBytes(OpKind kind, int64_t payloadBytes) const {
  const int64_t slot = static_cast<int64_t>(group_->slotBytes());
  if (payloadBytes >= crossMemoryMinBytes(kind) || config_.stagedRoundBytes == 0) return slot;
  return std::min(slot, config_.stagedRoundBytes);
}

std::shared_ptr<const Plan> ProcessGroupHOCCL::planFor(const PlanRequest& req) {
  // The round size is in the key: it changes with the group's view of its cores.
  const auto key = std::make_tuple(int(req.kind), req.root, int64_t(req.elemSize), req.bytes, req.slotBytes,
                                   bool(req.crossMemory), req.addressesPublished, req.everyTensorShared);
  std::lock_guard<std::mutex> lock(planMutex_);
  auto it = planCache_.find(key);
  if (it != planCache_.end()) return it->second;
  auto plan = std::make_shared<const Plan>(buildPlan(req));
  if (planCache_.size() > 256) planCache_.clear();
  planCache_[key] = plan;
  return plan;
}

bool ProcessGroupHOCCL::everyRankShared(uint32_t parity, int64_t bytes) const {
  for (int r = 0; r < localSize_; ++r) {
    const SharedRegionRef& ref = group_->blockRegions(r, parity)[0];
    if (!ref.covers(group_->blockAddresses(r, parity)[0], static_cast<uint64_t>(bytes))) return false;
  }
  return true;
}

// Before peers are told where this rank's buffers are: the blocks they will read with
// process_vm_readv go on huge pages when their range comes back (huge_pages.h). Only plans that
// read peers directly pin pages (the planner's own test decides); shared tensors are mapped, not
// pinned, and are left alone.
void ProcessGroupHOCCL::promoteReusedBuffers(const Collective& c, bool peersRead) {
  if (config_.hugePageMinBytes <= 0 || !peersRead) return;
  std::vector<std::pair<const char*, size_t>> spans;
  for (size_t i = 0; i < c.ctx.in.size(); ++i) {
    if (!c.ctx.in[i] || (c.req.kind == OpKind::AllToAll && static_cast<int>(i) == c.req.rank)) continue;
    size_t n = static_cast<size_t>(c.req.kind == OpKind::AllToAll ? c.sendBytes[i] : c.req.bytes);
    if (n > 0 && findSharedRegion(c.ctx.in[i], n).fd < 0) spans.emplace_back(c.ctx.in[i], n);
  }
  auto t0 = std::chrono::steady_clock::now();
  uint64_t promoted = hugePages_.notePeerReadable(std::move(spans));
  if (promoted > 0 && config_.debug >= 1)
    std::fprintf(stderr, "[hoccl rank %d] %s #%u: %.1f MiB of a reused buffer moved onto huge pages in %.1f ms\n",
                 rank_, c.opName, c.ctx.desc.opSeq, promoted / 1048576.0,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

namespace {
// Bytes this rank's outputs receive.
int64_t outputBytes(const PlanRequest& req, const std::vector<int64_t>& recvBytes) {
  switch (req.kind) {
    case OpKind::AllGather:
    case OpKind::Gather: return req.bytes * req.world;
    case OpKind::AllToAll: {
      int64_t total = 0;
      for (int64_t b : recvBytes) total += b;
      return total;
    }
    default: return req.bytes;
  }
}
}  // namespace

void ProcessGroupHOCCL::runCollective(Collective& c) {
  c.start = std::chrono::steady_clock::now();
  c.deadline = c.start + timeout_;
  // A plan on one host's shared memory names its ranks there (a plan across hosts: runAcrossHosts).
  c.req.rank = localRank_;
  c.req.world = localSize_;
  noteCoreSharing(c);
  c.req.slotBytes = stagingRoundBytes(c.req.kind, c.req.bytes);  // all_to_all: set again from the agreed size
  c.req.oneShotMaxBytes = config_.oneShotMaxBytes;
  c.req.crossMemory = group_->crossMemory();
  c.req.crossMemoryMinBytes = crossMemoryMinBytes(c.req.kind);
  c.req.allReduceDirectReadMaxBytes = config_.allReduceDirectReadMaxBytes;
  c.ctx.streamOutputs = config_.streamingCopyMinBytes > 0 &&
                        outputBytes(c.req, c.recvBytes) >= config_.streamingCopyMinBytes;
  c.ctx.desc.opSeq = ++opSeq_;
  c.ctx.desc.kind = static_cast<int8_t>(c.req.kind);
  c.ctx.desc.dtype = static_cast<int8_t>(c.ctx.dtype);
  c.ctx.desc.redop = static_cast<int8_t>(c.ctx.op);
  c.ctx.desc.root = c.req.root;
  c.ctx.check = [&](int peer) { checkWait(c, peer); };
  if (profile_) c.ctx.times = &c.times;
  if (group_->aborted())
    throw std::runtime_error(std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) +
                             ": the group was aborted earlier: " + group_->abortMessage());

  if (c.ctx.net) {
    runAcrossHosts(c);  // across_hosts.cpp
    return;
  }
  promoteReusedBuffers(c, readsPeersDirectly(c.req));

  if (c.req.kind == OpKind::AllToAll) {
    runAllToAll(c);  // alltoall.cpp
  } else if (allReduceChoosesAfterPublishing(c.req)) {
    // Past the direct-read limit, staging beats cross-memory reads but not mapped reads of
    // shared tensors. One barrier publishes every rank's address and region (and checks the
    // descriptors); every rank then reads the same table and picks the same plan. For ordinary
    // tensors this costs one barrier on an op of tens of milliseconds.
    uint32_t parity = executor_->nextBarrier() & 1;
    c.ctx.validate = [&](uint32_t p) { validateDescriptors(c, p); };
    PlanRequest publish = c.req;
    publish.kind = OpKind::Barrier;
    executor_->run(buildPlan(publish), c.ctx);
    c.ctx.validate = nullptr;
    c.req.addressesPublished = true;
    c.req.everyTensorShared = everyRankShared(parity, c.req.bytes);
    runPlan(c, planFor(c.req));
  } else {
    c.ctx.validate = [&](uint32_t p) { validateDescriptors(c, p); };
    runPlan(c, planFor(c.req));
  }
}

void ProcessGroupHOCCL::runPlan(Collective& c, const std::shared_ptr<const Plan>& plan) {
  {
    std::lock_guard<std::mutex> lock(lastAlgoMutex_);
    lastAlgo_ = plan->algo;
  }
  if (config_.debug >= 2) std::fprintf(stderr, "[hoccl rank %d] %s", rank_, plan->describe().c_str());
  const uint64_t mappedBefore = config_.debug >= 2 ? PeerMappings::bytesRead() : 0;
  executor_->run(*plan, c.ctx);
  executor_->endOp();
  if (!profile_) return;
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c.start).count();
  profile_->record(c.opName, plan->algo, c.req.bytes, us, c.times);
  if (config_.debug >= 2) {
    const PhaseTimes& t = c.times;
    // mapped = bytes read from peers' shared tensors (hoccl_backend.empty) through mappings
    // (process-wide counter: approximate while other groups run ops on other threads).
    // The phases add up the op's plans so far; "other" is the rest of the time since the op
    // started (argument checks, split exchange, plan lookup, huge-page advice).
    std::fprintf(stderr,
                 "[hoccl rank %d] %s #%u algo=%s transport=%s bytes=%lld mapped=%llu time=%.1f us "
                 "(barriers %.1f in %d, copies %.1f, peer reads %.1f, reductions %.1f, other %.1f)\n",
                 rank_, c.opName, c.ctx.desc.opSeq, plan->algo.c_str(),
                 plan->readsPeers() ? "shm+cma" : "shm",
                 static_cast<long long>(c.req.bytes),
                 static_cast<unsigned long long>(PeerMappings::bytesRead() - mappedBefore), us, t.barrierUs,
                 t.barriers, t.copyUs, t.readUs, t.reduceUs,
                 us - t.barrierUs - t.copyUs - t.readUs - t.reduceUs);
  }
}

}  // namespace hoccl
