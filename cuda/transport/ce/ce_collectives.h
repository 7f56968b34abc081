// The cuda-ce collectives: what the process group calls for CUDA tensors (one CeGroup per process
// group and device), also exposed to tests and benchmarks as _CeGroup.
//
// Everything is enqueued on the caller's stream and returns without waiting for the GPU (except
// host-side reductions, which block the calling thread: call from the PG worker, never the user
// thread).
//
// Plans: a CeGroup runs plans, it does not choose them. Each op fills a PlanRequest (request():
// onCopyEngine, everyPeerMapped = the group's p2p path, slotBytes; all_to_all adds a one-phase
// schedule) and runs the plan of the PlanRule it was created with: plan/'s buildPlan, whose
// copy-engine branch (plan/copy_engine.cpp) is the one choice rule.
// Host path (pinned host staging; what HOCCL_CE_PATH=auto takes between ranks on one GPU): the
// same Plans the CPU transport runs; CePlanExecutor enqueues them: copy-engine copies through the
// shared slots, barriers as stream memory operations, reductions by the bounded kernel
// (HOCCL_REDUCE_ON=gpu) or the CPU (host).
// P2P path (every pair p2p): plans that read peers' blocks in place (Plan::readsPeers), here one
// D2D each out of the peer's buffer mapped through CUDA IPC (pull).
// On the CPU the plans' first barrier publishes the buffer addresses; a stream barrier cannot
// carry them to the host, so the host exchanges them (IpcExchange) before enqueueing, and that
// first barrier still orders the reads after the peer's stream reached the op (its input is
// written). The final barrier keeps every rank's blocks unchanged until all readers are done.
//
// Threading/streams: a CeGroup is not thread-safe and must be driven from one stream per group
// (the comm stream): the flags' sequence numbers assume one order of ops, and writes from two
// streams could move a flag backwards.
// Destruction first waits (up to the timeout) for the work this group enqueued, since it
// unregisters and unmaps memory those copies target; if that work never finishes, it reports the
// unsatisfied flags and leaves the memory mapped rather than let the DMA hit freed pages.
// CUDA graph capture is refused (ceRefuseCapture): the flags carry per-call sequence numbers that
// a replayed graph would reuse.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/plan_types.h"
#include "transport/ce/ce_copy.h"
#include "transport/ce/ce_ipc.h"
#include "transport/ce/ce_plan_executor.h"
#include "transport/ce/ce_reduce.h"
#include "transport/ce/ce_sync.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

struct CeGroupOptions {
  size_t slotBytes = 8 << 20;  // host staging per rank per slot (two slots)
  CePathMode pathMode = CePathMode::Auto;
  ReduceOn reduceOn = ReduceOn::Host;
  int reduceCtas = 4;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  uint32_t firstSeq = 0;  // sequence numbers start after this (tests start near 2^32: wrap-around)
  static CeGroupOptions fromEnv();  // HOCCL_CE_PATH, HOCCL_REDUCE_ON, HOCCL_REDUCE_CTAS
};

// Throws "hoccl <op>: CUDA graph capture is not supported ..." when `stream` is capturing. Call
// it on the caller's thread with the caller's stream, before anything joins another stream into
// the capture.
void ceRefuseCapture(CUstream stream, const char* op);

// The rule that chooses each op's plan; the creator passes plan/'s (buildPlan, readsPeersDirectly),
// so the copy engines run the plans every other executor's choices come from.
struct PlanRule {
  std::function<Plan(const PlanRequest&)> build;  // the plan of req.rank
  // Whether the op's plans read peers' buffers in place: the same on every rank, also where a
  // rank's own plan reads nobody (broadcast's root still announces the buffer the others read).
  std::function<bool(const PlanRequest&)> readsInPlace;
};

class CeGroup {
 public:
  // Collective over the group: every rank constructs with the same store prefix and rule.
  CeGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int world,
          int device, CeGroupOptions opts, PlanRule rule);
  ~CeGroup();
  CeGroup(const CeGroup&) = delete;
  CeGroup& operator=(const CeGroup&) = delete;

  // out = concat over ranks of each rank's `bytes` from `in` (out holds world * bytes).
  void allGather(CUstream stream, CUdeviceptr out, CUdeviceptr in, size_t bytes);
  // out block r (blockBytes each) = rank r's in block `rank` (in and out hold world blocks).
  void allToAll(CUstream stream, CUdeviceptr out, CUdeviceptr in, size_t blockBytes);
  // buf on every rank = root's buf.
  void broadcast(CUstream stream, CUdeviceptr buf, size_t bytes, int root);
  // In place: buf[i] = op over ranks of buf[i]; factor for PREMUL_SUM.
  void allReduce(CUstream stream, CUdeviceptr buf, int64_t count, c10::ScalarType dtype, RedOp op, double factor);

  const std::vector<PeerInfo>& peers() const { return peers_; }
  std::string describePaths() const;  // e.g. "0:host 1:p2p"
  // The algorithm of the last op's plan, e.g. "allreduce/rs-ag" or "all_gather/direct-read".
  const std::string& lastAlgo() const { return lastAlgo_; }
  int rank() const { return rank_; }

  // Watchdog: waits until the work this group last enqueued has run; after `timeout` throws,
  // naming each cross-rank wait the host sees unsatisfied (which peer, which value).
  void synchronize(std::chrono::milliseconds timeout);
  std::string flagState() const;
  size_t ipcMappings() const { return ipc_->openMappings(); }
  size_t ipcStoreKeys() const { return ipc_->exportedKeys(); }

 private:
  std::vector<int> peersOn(CePath path) const;
  bool allP2P() const;
  // What this rank passes the rule for an op: identical on all ranks but `rank`, so all build
  // plans of the same shape (barriers, staging buffers) and their flags stay in lockstep.
  PlanRequest request(OpKind kind, int64_t elemSize, int64_t bytes, int root = 0) const;
  // Runs the rule's plan for `req`: through runDirectRead when the op reads peers in place (`in`
  // / `out`: the regions holding this rank's In / Out blocks, laid out alike on every rank).
  void run(CUstream stream, const PlanRequest& req, const CePlanArgs& args, IpcRegion in, IpcRegion out);
  // Exports this rank's regions the peers' plans read, maps the peers' blocks `plan` reads, then
  // runs it.
  void runDirectRead(CUstream stream, const PlanRequest& req, const Plan& plan, CePlanArgs args, IpcRegion in,
                     IpcRegion out);
  void runPlan(CUstream stream, const Plan& plan, const CePlanArgs& args);
  void syncStream(CUstream s, const char* what);
  void waitForEvent(CUevent e, std::chrono::steady_clock::time_point deadline, const std::string& what);
  void finishOp(CUstream s) noexcept;

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_, world_, device_;
  CeGroupOptions opts_;
  PlanRule rule_;
  std::vector<PeerInfo> peers_;
  std::unique_ptr<SharedHostRegion> flagRegion_;
  std::unique_ptr<CeSync> barrier_;  // the plans' barriers
  std::unique_ptr<HostStaging> staging_;
  std::unique_ptr<IpcExchange> ipc_;
  std::unique_ptr<CePlanExecutor> exec_;  // the host path
  CUevent done_ = nullptr;        // recorded after each op: what synchronize() and teardown wait for
  CUevent streamSync_ = nullptr;  // host reductions: "the stream reached here"
  uint32_t opSeq_;                // last direct-read op (same on every rank; cyclic)
  std::string lastAlgo_;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
