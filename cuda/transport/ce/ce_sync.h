// Zero-SM cross-rank signalling for the copy-engine transport (a "semaphore" in MSCCL++ terms).
//
// Every ordered pair (src -> dst) owns one uint32 word in host shared memory, written only by
// src and read only by dst. signal() enqueues cuStreamWriteValue32 of a sequence number into
// that word; wait() enqueues cuStreamWaitValue32 (one cuStreamBatchMemOp for several peers)
// with GEQ, which the driver evaluates cyclically ((int32_t)(*addr - value) >= 0), so sequence
// numbers never need resetting and survive wrap-around. No kernel runs: the GPU's front end
// executes these operations, not the SMs.
//
// Caveat (cuda.h): ordering created by stream memory operations is invisible to CUDA's
// dependency tracking; a wait whose signal never comes hangs the stream. Callers keep
// per-pair sequences in lockstep (same plan on every rank) and check peers' liveness on the host.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/ce/ce_host_memory.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

class CeSync {
 public:
  // Bytes of shared host memory the flags of a `world`-rank group need (one 128-byte row per
  // receiver, so a receiver's batch wait touches few cache lines).
  static size_t bytesNeeded(int world);

  // `region` (zeroed, identical on every rank) holds the flags at `offset`.
  CeSync(const SharedHostRegion& region, size_t offset, int rank, int world);
  CeSync(const CeSync&) = delete;
  CeSync& operator=(const CeSync&) = delete;

  // After all prior work in `stream`, make flag(rank -> peer) = seq visible to peer.
  // The default write carries a memory barrier: the peer sees the data written before it.
  void signal(CUstream stream, int peer, uint32_t seq);
  // `stream` stalls until flag(peer -> rank) >= seq (cyclic compare).
  void wait(CUstream stream, int peer, uint32_t seq);
  // One batch of waits (chunks of < 256 ops, the driver's limit); peers[i] with seqs[i].
  void waitMany(CUstream stream, const std::vector<int>& peers, const std::vector<uint32_t>& seqs);

  // Lockstep helpers: every call bumps the pair's own counter, so matching calls on both ranks
  // pair up without passing numbers around.
  uint32_t signalNext(CUstream stream, int peer);
  uint32_t waitNext(CUstream stream, int peer);
  void waitNextAll(CUstream stream, const std::vector<int>& peers);

  // Host view, for the CPU side (host reductions on staged data, timeouts, debugging).
  uint32_t inbound(int peer) const;  // flag(peer -> rank) as the host sees it now
  void hostSignal(int peer, uint32_t seq);  // CPU writes flag(rank -> peer)
  // Spins briefly, then sleeps; false once `deadline` passed.
  bool hostWait(int peer, uint32_t seq, std::chrono::steady_clock::time_point deadline) const;
  uint32_t nextSignalSeq(int peer) { return ++sent_[peer]; }
  uint32_t nextWaitSeq(int peer) { return ++expected_[peer]; }

  // Sets every flag this rank writes to `seq` from the host: the value "nothing signalled yet"
  // for a group whose first sequence number is seq + 1. Before any peer waits (a barrier).
  void hostInit(uint32_t seq);
  // The waits enqueued so far that the host sees unsatisfied, e.g.
  // "READY from rank 1: the stream waits for >= 7, the flag holds 6"; "" when none.
  std::string unsatisfiedWaits(const char* name) const;

  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  size_t wordOffset(int src, int dst) const;
  void noteWait(int peer, uint32_t seq);
  volatile uint32_t* hostWord(int src, int dst) const;

  const SharedHostRegion& region_;
  size_t offset_;
  int rank_, world_;
  std::vector<uint32_t> sent_;      // last seq signalled to each peer
  std::vector<uint32_t> expected_;  // last seq waited for from each peer
  std::vector<uint32_t> waited_;    // highest seq a stream wait asked of each peer
  std::vector<bool> everWaited_;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
