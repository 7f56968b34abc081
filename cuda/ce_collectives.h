// Reference cuda-ce collectives composed from the primitives (ce_sync, ce_copy, ce_reduce).
//
// This is the sequence the core's GPU executor follows; the core may drive a CeGroup directly
// (one per process group and device) or mirror these steps per Plan step. Everything is
// enqueued on the caller's stream and returns without waiting for the GPU (except host-side
// reductions, which block the calling thread — call from the PG worker, never the user thread).
//
//  all_gather:  host path  D2H own block -> own slot, signal READY; per peer: wait READY,
//                          H2D peer slot -> out, signal DONE (slot reusable). Chunked by slot size,
//                          two slots alternate.
//               p2p path   signal ARM (my out may now be written), wait peers' ARM, D2D my block
//                          into each peer's IPC-mapped out, signal DATA, wait peers' DATA.
//  all_reduce:  (one-shot, host staged) D2H own chunk -> slot, signal READY to all (self too);
//               gpu: wait READY, H2D peers' chunks -> device scratch, bounded reduction kernel
//                    (sources in rank order, result into the tensor), signal DONE;
//               host: CPU waits READY, reduces from the shared slots, H2D result, signal DONE.
// No kernel runs in all_gather; all_reduce launches only the reduction kernel (gpu mode).
//
// Threading/streams: a CeGroup is not thread-safe and must be driven from one stream per group
// (the comm stream): host-mode DONE flags are written by the CPU after synchronising that
// stream, and an older stream-ordered write on another stream could move a flag backwards.
// CUDA graph capture is refused (see docs/cuda.md).
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ce_copy.h"
#include "ce_reduce.h"
#include "ce_sync.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

struct CeGroupOptions {
  size_t slotBytes = 8 << 20;  // host staging per rank per slot (two slots)
  CePathMode pathMode = CePathMode::Auto;
  ReduceOn reduceOn = ReduceOn::Host;
  int reduceCtas = 4;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  static CeGroupOptions fromEnv();  // HOCCL_CE_PATH, HOCCL_REDUCE_ON, HOCCL_REDUCE_CTAS
};

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
  // In place: buf[i] = op over ranks of buf[i]; factor for PREMUL_SUM.
  void allReduce(CUstream stream, CUdeviceptr buf, int64_t count, c10::ScalarType dtype, RedOp op, double factor);

  const std::vector<PeerInfo>& peers() const { return peers_; }
  std::string describePaths() const;  // e.g. "0:host 1:p2p"
  int rank() const { return rank_; }

 private:
  enum Flag { kReady = 0, kDone, kArm, kData, kFlagSets };
  CeSync& flags(Flag f) { return *sync_[f]; }
  std::vector<int> peersOn(CePath path) const;
  void gatherHostChunked(CUstream s, CUdeviceptr out, CUdeviceptr in, size_t bytes,
                         const std::vector<int>& hostPeers);
  void gatherP2P(CUstream s, CUdeviceptr out, CUdeviceptr in, size_t bytes, const std::vector<int>& p2pPeers);
  void reduceChunkGpu(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op, double factor,
                      uint32_t seq);
  void reduceChunkHost(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op, double factor,
                       uint32_t seq);
  void hostWaitAll(Flag f, uint32_t seq, const char* what);
  std::vector<int> everyone() const;

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_, world_, device_;
  CeGroupOptions opts_;
  std::vector<PeerInfo> peers_;
  std::unique_ptr<SharedHostRegion> flagRegion_;
  std::vector<std::unique_ptr<CeSync>> sync_;
  std::unique_ptr<HostStaging> staging_;
  std::unique_ptr<IpcRegistry> ipc_;
  std::unique_ptr<ReduceKernel> reduce_;  // gpu mode only
  std::unique_ptr<DeviceBuffer> scratch_; // gpu mode: world slots of peers' chunks
  uint32_t published_ = 0;  // staging chunks published so far (same on every rank)
  uint32_t opSeq_ = 0;      // p2p operations so far (same on every rank)
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
