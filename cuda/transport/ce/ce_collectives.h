// Reference cuda-ce collectives composed from the primitives (ce_sync, ce_copy, ce_reduce).
//
// This is the sequence the core's GPU executor follows; the core may drive a CeGroup directly
// (one per process group and device) or mirror these steps per Plan step. Everything is
// enqueued on the caller's stream and returns without waiting for the GPU (except host-side
// reductions, which block the calling thread — call from the PG worker, never the user thread).
//
// Host path (staging "rounds"): every rank counts rounds; round n uses slot (n-1)%2 of each rank.
// A publisher D2H-copies into its slot (after DONE from every peer for the round it last put
// there), signals READY(n); a consumer waits READY(n), H2D-copies out of the publisher's slot,
// signals DONE(n). Chunked by slot size, so any message size works with two slots.
//  all_gather:  each round, every rank publishes a chunk of its block; everyone consumes all
//               (own block too, via H2D: a same-device D2D might run on SMs).
//  all_to_all:  each round, every rank publishes one piece per destination.
//  broadcast:   the root publishes, the others consume.
// P2P path (every pair p2p): push model over CUDA IPC. A reader signals ARM (its buffer may be
// overwritten: its stream reached this op), a writer waits ARM, copies D2D straight into the
// reader's IPC-mapped buffer, signals DATA; the reader waits DATA.
//  all_reduce:  (one-shot, host staged, any path) every rank publishes its chunk each round;
//               gpu: consume peers' chunks (H2D) into device scratch, then one bounded reduction
//                    kernel (sources in rank order, result into the tensor);
//               host: the CPU waits READY, reduces from the shared slots, H2D result, DONE.
// No kernel runs in all_gather/all_to_all/broadcast; all_reduce launches only the reduction
// kernel (gpu mode).
//
// Threading/streams: a CeGroup is not thread-safe and must be driven from one stream per group
// (the comm stream): host-mode DONE flags are written by the CPU after synchronising that
// stream, and an older stream-ordered write on another stream could move a flag backwards.
// Destruction first waits (up to the timeout) for the work this group enqueued, since it
// unregisters and unmaps memory those copies target; if that work never finishes, it reports the
// unsatisfied flags and leaves the memory mapped rather than let the DMA hit freed pages.
// CUDA graph capture is refused (ceRefuseCapture): the flags carry per-call sequence numbers that
// a replayed graph would reuse.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "transport/ce/ce_copy.h"
#include "transport/ce/ce_ipc.h"
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

class CeGroup {
 public:
  // Collective over the group: every rank constructs with the same store prefix.
  CeGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int world,
          int device, CeGroupOptions opts);
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
  int rank() const { return rank_; }

  // Watchdog: waits until the work this group last enqueued has run; after `timeout` throws,
  // naming each cross-rank wait the host sees unsatisfied (which peer, which value).
  void synchronize(std::chrono::milliseconds timeout);
  std::string flagState() const;
  size_t ipcMappings() const { return ipc_->openMappings(); }
  size_t ipcStoreKeys() const { return ipc_->exportedKeys(); }

 private:
  enum Flag { kReady = 0, kDone, kArm, kData, kFlagSets };
  CeSync& flags(Flag f) { return *sync_[f]; }
  struct P2PWrite {
    int peer;
    size_t dstOffset;  // into the peer's destination buffer
    CUdeviceptr src;
    size_t bytes;
  };
  std::vector<int> peersOn(CePath path) const;
  std::vector<int> everyone() const;  // every rank but this one
  bool allP2P() const;
  uint32_t beginRound(CUstream s, bool publish);
  void publishReady(CUstream s, uint32_t round);
  void stageOut(CUstream s, uint32_t round, size_t slotOffset, CUdeviceptr src, size_t len);
  void consume(CUstream s, int from, uint32_t round, size_t slotOffset, CUdeviceptr dst, size_t len);
  void pushP2P(CUstream s, CUdeviceptr myDst, size_t myDstBytes, const std::vector<P2PWrite>& writes,
               const std::vector<int>& writers);
  void reduceChunkGpu(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op, double factor,
                      uint32_t round);
  void reduceChunkHost(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op, double factor,
                       uint32_t round);
  void hostWaitAll(Flag f, uint32_t seq, const char* what);
  void waitForEvent(CUevent e, std::chrono::steady_clock::time_point deadline, const std::string& what);
  void finishOp(CUstream s) noexcept;

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_, world_, device_;
  CeGroupOptions opts_;
  std::vector<PeerInfo> peers_;
  std::unique_ptr<SharedHostRegion> flagRegion_;
  std::vector<std::unique_ptr<CeSync>> sync_;
  std::unique_ptr<HostStaging> staging_;
  std::unique_ptr<IpcExchange> ipc_;
  std::unique_ptr<ReduceKernel> reduce_;  // gpu mode only
  std::unique_ptr<DeviceBuffer> scratch_; // gpu mode: world slots of peers' chunks
  CUevent done_ = nullptr;       // recorded after each op: what synchronize() and teardown wait for
  CUevent streamSync_ = nullptr;  // host reductions: "the stream reached here"
  uint32_t round_;                       // last staging round (same on every rank; cyclic)
  uint32_t lastRoundInSlot_[2] = {0, 0};  // round this rank last published in each slot
  bool slotUsed_[2] = {false, false};     // (a round number may be 0 after wrap-around)
  uint32_t opSeq_;                        // last p2p op (same on every rank; cyclic)
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
