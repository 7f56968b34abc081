#include "transport/ce/ce_sync.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

namespace {
constexpr size_t kRowBytes = 128;
constexpr size_t kMaxBatch = 255;  // cuStreamBatchMemOp takes fewer than 256 operations

size_t rowBytes(int world) { return (world * sizeof(uint32_t) + kRowBytes - 1) / kRowBytes * kRowBytes; }
}  // namespace

size_t CeSync::bytesNeeded(int world) { return rowBytes(world) * world; }

CeSync::CeSync(const SharedHostRegion& region, size_t offset, int rank, int world)
    : region_(region), offset_(offset), rank_(rank), world_(world), sent_(world, 0), expected_(world, 0), waited_(world, 0), everWaited_(world, false) {
  if (offset + bytesNeeded(world) > region.size())
    throw std::invalid_argument("hoccl: CeSync flags do not fit in the shared host region");
  if (offset % sizeof(uint32_t) != 0) throw std::invalid_argument("hoccl: CeSync offset must be 4-byte aligned");
}

// Row `dst`, column `src`: the receiver's words are contiguous.
size_t CeSync::wordOffset(int src, int dst) const {
  return offset_ + rowBytes(world_) * dst + sizeof(uint32_t) * src;
}

volatile uint32_t* CeSync::hostWord(int src, int dst) const {
  return static_cast<volatile uint32_t*>(region_.hostPtr(wordOffset(src, dst)));
}

void CeSync::signal(CUstream stream, int peer, uint32_t seq) {
  cu::check(cu::driver().cuStreamWriteValue32(stream, region_.devicePtr(wordOffset(rank_, peer)), seq,
                                              CU_STREAM_WRITE_VALUE_DEFAULT),
            "cuStreamWriteValue32 (signal)");
}

void CeSync::wait(CUstream stream, int peer, uint32_t seq) {
  noteWait(peer, seq);
  cu::check(cu::driver().cuStreamWaitValue32(stream, region_.devicePtr(wordOffset(peer, rank_)), seq,
                                             CU_STREAM_WAIT_VALUE_GEQ),
            "cuStreamWaitValue32 (wait)");
}

void CeSync::waitMany(CUstream stream, const std::vector<int>& peers, const std::vector<uint32_t>& seqs) {
  if (peers.size() != seqs.size()) throw std::invalid_argument("hoccl: CeSync::waitMany size mismatch");
  if (peers.size() == 1) return wait(stream, peers[0], seqs[0]);
  std::vector<CUstreamBatchMemOpParams> ops;
  for (size_t begin = 0; begin < peers.size(); begin += kMaxBatch) {
    size_t end = std::min(peers.size(), begin + kMaxBatch);
    ops.assign(end - begin, CUstreamBatchMemOpParams{});
    for (size_t i = begin; i < end; ++i) {
      noteWait(peers[i], seqs[i]);
      auto& w = ops[i - begin].waitValue;
      w.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      w.address = region_.devicePtr(wordOffset(peers[i], rank_));
      w.value = seqs[i];
      w.flags = CU_STREAM_WAIT_VALUE_GEQ;
    }
    cu::check(cu::driver().cuStreamBatchMemOp(stream, static_cast<unsigned>(ops.size()), ops.data(), 0),
              "cuStreamBatchMemOp (wait)");
  }
}

void CeSync::noteWait(int peer, uint32_t seq) {
  if (!everWaited_[peer] || static_cast<int32_t>(seq - waited_[peer]) > 0) waited_[peer] = seq;
  everWaited_[peer] = true;
}

void CeSync::hostInit(uint32_t seq) {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    *hostWord(rank_, p) = seq;
    sent_[p] = expected_[p] = seq;
  }
  std::atomic_thread_fence(std::memory_order_release);
}

std::string CeSync::unsatisfiedWaits(const char* name) const {
  std::string out;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || !everWaited_[p]) continue;
    const uint32_t now = inbound(p);
    if (static_cast<int32_t>(now - waited_[p]) >= 0) continue;
    out += (out.empty() ? "" : "; ") + std::string(name) + " from rank " + std::to_string(p) +
           ": the stream waits for >= " + std::to_string(waited_[p]) + ", the flag holds " + std::to_string(now);
  }
  return out;
}

uint32_t CeSync::signalNext(CUstream stream, int peer) {
  uint32_t seq = nextSignalSeq(peer);
  signal(stream, peer, seq);
  return seq;
}

uint32_t CeSync::waitNext(CUstream stream, int peer) {
  uint32_t seq = nextWaitSeq(peer);
  wait(stream, peer, seq);
  return seq;
}

void CeSync::waitNextAll(CUstream stream, const std::vector<int>& peers) {
  std::vector<uint32_t> seqs;
  seqs.reserve(peers.size());
  for (int p : peers) seqs.push_back(nextWaitSeq(p));
  waitMany(stream, peers, seqs);
}

uint32_t CeSync::inbound(int peer) const {
  std::atomic_thread_fence(std::memory_order_acquire);
  return *hostWord(peer, rank_);
}

void CeSync::hostSignal(int peer, uint32_t seq) {
  std::atomic_thread_fence(std::memory_order_release);  // data before the flag
  *hostWord(rank_, peer) = seq;
}

bool CeSync::hostWait(int peer, uint32_t seq, std::chrono::steady_clock::time_point deadline) const {
  for (int spin = 0;; ++spin) {
    if (static_cast<int32_t>(inbound(peer) - seq) >= 0) return true;  // same cyclic GEQ as the GPU
    if (spin > 1000) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(20));  // never burn a core for long
    }
  }
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
