#include "transport/ce/ce_collectives.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <thread>

#include "exec/reduce_kernels.h"
#include "transport/ce/kernels/reduce_args.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

CeGroupOptions CeGroupOptions::fromEnv() {
  CeGroupOptions o;
  o.pathMode = cePathModeFromEnv();
  o.reduceOn = reduceOnFromEnv();
  o.reduceCtas = reduceCtasFromEnv();
  return o;
}

namespace {

// Every rank adds 1 to `key`; returns once all `world` did.
void storeBarrier(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int world, int rank,
                  std::chrono::milliseconds timeout, const char* what) {
  store->add(key, 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store->add(key, 0) < world) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("hoccl cuda-ce on rank " + std::to_string(rank) + ": timed out " + what);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Group-wide AND of "all my pairs are p2p": the reference collectives use one path for the whole
// group, so every rank's staging-publication count stays identical.
bool groupAllP2P(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int world, int rank,
                 bool mineP2P, std::chrono::milliseconds timeout) {
  if (!mineP2P) store->add(prefix + "/host_votes", 1);
  storeBarrier(store, prefix + "/votes", world, rank, timeout, "agreeing on the ce path");
  return store->add(prefix + "/host_votes", 0) == 0;
}

// Ends an op on every path out of it (also when it throws half-way: what was enqueued counts).
struct OpEnd {
  std::function<void()> end;
  ~OpEnd() { end(); }
};

}  // namespace

// Graph capture would freeze this call's sequence numbers into the graph's memop nodes; on
// replay the GEQ waits would already be satisfied and ranks would race. Refuse clearly.
void ceRefuseCapture(CUstream stream, const char* op) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cu::check(cu::driver().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  if (status != CU_STREAM_CAPTURE_STATUS_NONE)
    throw std::runtime_error(std::string("hoccl ") + op +
                             ": CUDA graph capture is not supported by the cuda-ce transport yet (its "
                             "cross-rank flags carry per-call sequence numbers that a replayed graph would reuse)");
}

CeGroup::CeGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int world,
                 int device, CeGroupOptions opts)
    : store_(store), prefix_(prefix), rank_(rank), world_(world), device_(device), opts_(opts),
      round_(opts.firstSeq), opSeq_(opts.firstSeq) {
  peers_ = discoverPeers(store, prefix + "/peers", rank, world, device, opts.pathMode, opts.timeout);
  bool mineP2P = true;
  for (int r = 0; r < world; ++r)
    if (r != rank && peers_[r].path != CePath::P2P) mineP2P = false;
  if (!groupAllP2P(store, prefix + "/path", world, rank, mineP2P, opts.timeout))
    for (auto& p : peers_) p.path = CePath::Host;
  const size_t flagBytes = CeSync::bytesNeeded(world);
  flagRegion_ = std::make_unique<SharedHostRegion>(store, prefix + "/flags", rank, world,
                                                   flagBytes * kFlagSets + IpcExchange::bytesNeeded(world), device,
                                                   opts.timeout);
  for (int f = 0; f < kFlagSets; ++f) {
    sync_.push_back(std::make_unique<CeSync>(*flagRegion_, flagBytes * f, rank, world));
    sync_.back()->hostInit(opts.firstSeq);
  }
  ipc_ = std::make_unique<IpcExchange>(store, prefix + "/ipc", rank, world, device, *flagRegion_,
                                       flagBytes * kFlagSets, opts.firstSeq, opts.timeout);
  staging_ = std::make_unique<HostStaging>(store, prefix + "/stage", rank, world, opts.slotBytes, 2, device,
                                           opts.timeout);
  if (opts.reduceOn == ReduceOn::Gpu) {
    reduce_ = std::make_unique<ReduceKernel>(device, opts.reduceCtas);
    scratch_ = std::make_unique<DeviceBuffer>(staging_->slotBytes() * world, device);
  }
  cu::ContextGuard guard(device);
  cu::check(cu::driver().cuEventCreate(&done_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  cu::check(cu::driver().cuEventCreate(&streamSync_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  // Every rank's flags hold firstSeq before any rank waits on them.
  storeBarrier(store, prefix + "/init", world, rank, opts.timeout, "waiting for every rank to set up its flags");
}

CeGroup::~CeGroup() {
  try {
    synchronize(opts_.timeout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s; leaving its host memory registered and mapped, since the stream may still copy "
                 "into it\n", e.what());
    ipc_.release();  // NOLINT: deliberately leaked, see above
    scratch_.release();
    staging_.release();
    flagRegion_.release();
    return;
  }
  try {
    cu::ContextGuard guard(device_);
    cu::driver().cuEventDestroy(done_);
    cu::driver().cuEventDestroy(streamSync_);
  } catch (...) {
    // Teardown: the driver may already be gone.
  }
}

void CeGroup::finishOp(CUstream s) noexcept {
  cu::driver().cuEventRecord(done_, s);  // a failure here surfaces in the next driver call
}

void CeGroup::waitForEvent(CUevent e, std::chrono::steady_clock::time_point deadline, const std::string& what) {
  for (;;) {
    CUresult r = cu::driver().cuEventQuery(e);
    if (r == CUDA_SUCCESS) return;
    if (r != CUDA_ERROR_NOT_READY) cu::check(r, "cuEventQuery");
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("hoccl cuda-ce on rank " + std::to_string(rank_) + ": " + what + "; " + flagState());
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void CeGroup::synchronize(std::chrono::milliseconds timeout) {
  cu::ContextGuard guard(device_);
  waitForEvent(done_, std::chrono::steady_clock::now() + timeout,
               "the comm stream has not finished this group's work after " + std::to_string(timeout.count()) + " ms");
}

std::string CeGroup::flagState() const {
  static const char* names[kFlagSets] = {"READY", "DONE", "ARM", "DATA"};
  std::string out;
  for (int f = 0; f < kFlagSets; ++f) {
    std::string s = sync_[f]->unsatisfiedWaits(names[f]);
    if (!s.empty()) out += (out.empty() ? "" : "; ") + s;
  }
  return out.empty() ? "no cross-rank wait is unsatisfied (the stream is busy with copies, a kernel, or work "
                       "it was ordered after)"
                     : "unsatisfied cross-rank waits: " + out;
}

std::vector<int> CeGroup::peersOn(CePath path) const {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && peers_[r].path == path) out.push_back(r);
  return out;
}

std::vector<int> CeGroup::everyone() const {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (r != rank_) out.push_back(r);
  return out;
}

std::string CeGroup::describePaths() const {
  std::string s;
  for (int r = 0; r < world_; ++r)
    s += (s.empty() ? "" : " ") + std::to_string(r) + ":" + (r == rank_ ? "self" : cePathName(peers_[r].path));
  return s;
}

bool CeGroup::allP2P() const { return world_ > 1 && peersOn(CePath::P2P).size() == static_cast<size_t>(world_ - 1); }

// Staging rounds: every rank counts every round (so slot parity agrees everywhere); round n uses
// slot (n-1)%2. A publisher may overwrite a slot only once every peer consumed the round it last
// published there (DONE >= that round); consumers signal DONE with the round they consumed.
// Every publication in these collectives is consumed by every other rank.
uint32_t CeGroup::beginRound(CUstream s, bool publish) {
  const uint32_t n = ++round_;
  const int slot = static_cast<int>((n - 1) % 2);
  if (publish) {
    auto peers = everyone();
    if (slotUsed_[slot] && !peers.empty())
      flags(kDone).waitMany(s, peers, std::vector<uint32_t>(peers.size(), lastRoundInSlot_[slot]));
    lastRoundInSlot_[slot] = n;
    slotUsed_[slot] = true;
  }
  return n;
}

void CeGroup::publishReady(CUstream s, uint32_t round) {
  for (int p : everyone()) flags(kReady).signal(s, p, round);
}

// Waits for `from`'s publication `round`, copies `len` bytes at `slotOffset` of its slot to dst
// (H2D: copy engine), then releases the slot.
void CeGroup::consume(CUstream s, int from, uint32_t round, size_t slotOffset, CUdeviceptr dst, size_t len) {
  const int slot = static_cast<int>((round - 1) % 2);
  if (from != rank_) flags(kReady).wait(s, from, round);
  ceCopyFromHost(s, dst, staging_->hostSlot(from, slot, slotOffset), len);
  if (from != rank_) flags(kDone).signal(s, from, round);
}

void CeGroup::stageOut(CUstream s, uint32_t round, size_t slotOffset, CUdeviceptr src, size_t len) {
  const int slot = static_cast<int>((round - 1) % 2);
  ceCopyToHost(s, staging_->hostSlot(rank_, slot, slotOffset), src, len);
}

void CeGroup::allGather(CUstream stream, CUdeviceptr out, CUdeviceptr in, size_t bytes) {
  if (bytes == 0) return;
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "all_gather");
  OpEnd end{[&] { finishOp(stream); }};
  if (allP2P()) {
    std::vector<P2PWrite> writes;
    for (int p : everyone()) writes.push_back({p, rank_ * bytes, in, bytes});
    pushP2P(stream, out, bytes * world_, writes, everyone());
    ceCopyAsync(stream, out + rank_ * bytes, in, bytes);
    return;
  }
  for (size_t off = 0; off < bytes; off += staging_->slotBytes()) {
    const size_t len = std::min(staging_->slotBytes(), bytes - off);
    const uint32_t n = beginRound(stream, true);
    stageOut(stream, n, 0, in + off, len);
    publishReady(stream, n);
    // Own block from the own slot too: H2D runs on a copy engine, a same-device D2D might not.
    for (int r = 0; r < world_; ++r) consume(stream, r, n, 0, out + r * bytes + off, len);
  }
}

void CeGroup::allToAll(CUstream stream, CUdeviceptr out, CUdeviceptr in, size_t blockBytes) {
  if (blockBytes == 0) return;
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "all_to_all");
  OpEnd end{[&] { finishOp(stream); }};
  if (allP2P()) {
    std::vector<P2PWrite> writes;
    for (int p : everyone()) writes.push_back({p, rank_ * blockBytes, in + p * blockBytes, blockBytes});
    pushP2P(stream, out, blockBytes * world_, writes, everyone());
    ceCopyAsync(stream, out + rank_ * blockBytes, in + rank_ * blockBytes, blockBytes);
    return;
  }
  // Each round carries one piece per destination: piece p of my slot is for rank p.
  const size_t piece = std::max<size_t>(256, staging_->slotBytes() / world_ / 256 * 256);
  for (size_t off = 0; off < blockBytes; off += piece) {
    const size_t len = std::min(piece, blockBytes - off);
    const uint32_t n = beginRound(stream, true);
    for (int p = 0; p < world_; ++p) stageOut(stream, n, p * piece, in + p * blockBytes + off, len);
    publishReady(stream, n);
    for (int r = 0; r < world_; ++r) consume(stream, r, n, rank_ * piece, out + r * blockBytes + off, len);
  }
}

void CeGroup::broadcast(CUstream stream, CUdeviceptr buf, size_t bytes, int root) {
  if (bytes == 0 || world_ == 1) return;
  if (root < 0 || root >= world_) throw std::invalid_argument("hoccl broadcast: root out of range");
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "broadcast");
  OpEnd end{[&] { finishOp(stream); }};
  if (allP2P()) {
    std::vector<P2PWrite> writes;
    if (rank_ == root)
      for (int p : everyone()) writes.push_back({p, 0, buf, bytes});
    pushP2P(stream, buf, bytes, writes, rank_ == root ? std::vector<int>{} : std::vector<int>{root});
    return;
  }
  for (size_t off = 0; off < bytes; off += staging_->slotBytes()) {
    const size_t len = std::min(staging_->slotBytes(), bytes - off);
    const uint32_t n = beginRound(stream, rank_ == root);
    if (rank_ == root) {
      stageOut(stream, n, 0, buf + off, len);
      publishReady(stream, n);
    } else {
      consume(stream, root, n, 0, buf + off, len);
    }
  }
}

// Push model over CUDA IPC: a writer copies straight into the reader's buffer once the reader
// said the buffer may be overwritten (ARM: its stream reached this op), then says the data is
// there (DATA). Sequence = this group's p2p op count, identical on every rank.
void CeGroup::pushP2P(CUstream s, CUdeviceptr myDst, size_t myDstBytes, const std::vector<P2PWrite>& writes,
                      const std::vector<int>& writers) {
  const uint32_t seq = ++opSeq_;
  std::vector<int> targets;
  for (const auto& w : writes) targets.push_back(w.peer);
  auto mapped = ipc_->exchange(seq, myDst, myDstBytes, targets, s);
  for (int w : writers) flags(kArm).signal(s, w, seq);
  if (!targets.empty()) flags(kArm).waitMany(s, targets, std::vector<uint32_t>(targets.size(), seq));
  for (const auto& w : writes) {
    if (w.dstOffset + w.bytes > mapped[w.peer].bytes)
      throw std::invalid_argument("hoccl: p2p write past the end of rank " + std::to_string(w.peer) + "'s buffer");
    ceCopyAsync(s, mapped[w.peer].ptr + w.dstOffset, w.src, w.bytes);
  }
  for (int t : targets) flags(kData).signal(s, t, seq);
  if (!writers.empty()) flags(kData).waitMany(s, writers, std::vector<uint32_t>(writers.size(), seq));
}

void CeGroup::allReduce(CUstream stream, CUdeviceptr buf, int64_t count, c10::ScalarType dtype, RedOp op,
                        double factor) {
  if (count == 0) return;
  std::string why = checkReducible(dtype, op);
  if (!why.empty()) throw std::invalid_argument("hoccl all_reduce: " + why);
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "all_reduce");
  OpEnd end{[&] { finishOp(stream); }};
  const size_t elem = hoccl::elementSize(dtype);
  const int64_t chunkElems = static_cast<int64_t>(staging_->slotBytes() / elem);
  for (int64_t first = 0; first < count; first += chunkElems) {
    const int64_t n = std::min(chunkElems, count - first);
    const uint32_t round = beginRound(stream, true);
    stageOut(stream, round, 0, buf + first * elem, n * elem);
    publishReady(stream, round);
    if (reduce_) reduceChunkGpu(stream, buf + first * elem, n, dtype, op, factor, round);
    else reduceChunkHost(stream, buf + first * elem, n, dtype, op, factor, round);
  }
}

void CeGroup::reduceChunkGpu(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op,
                             double factor, uint32_t round) {
  const size_t bytes = count * hoccl::elementSize(dtype);
  std::vector<CUdeviceptr> srcs(world_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ && r < HOCCL_REDUCE_MAX_SRCS) {
      srcs[r] = dst;  // own data never leaves the device
      continue;
    }
    // A later rank's own data cannot stay in dst: the chained launches overwrite dst with the
    // running result first. It comes back from this rank's own slot (no flag: same stream).
    srcs[r] = scratch_->ptr(static_cast<size_t>(r) * staging_->slotBytes());
    consume(s, r, round, 0, srcs[r], bytes);
  }
  reduce_->launch(s, dst, srcs, count, dtype, op, factor, world_, /*finalize=*/true);
}

void CeGroup::hostWaitAll(Flag f, uint32_t seq, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    if (!flags(f).hostWait(r, seq, deadline))
      throw std::runtime_error(std::string("hoccl ") + what + " on rank " + std::to_string(rank_) +
                               ": timed out waiting for rank " + std::to_string(r) + " (its flag holds " +
                               std::to_string(flags(f).inbound(r)) + ", the host waits for >= " +
                               std::to_string(seq) + "); " + flagState());
  }
}

// The CPU reduces straight from the shared slots; it must first see its own D2H finished, and
// must not signal DONE from the host while older stream-ordered DONE writes are still queued
// (the word would go backwards), hence the stream synchronisations.
void CeGroup::reduceChunkHost(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op,
                              double factor, uint32_t seq) {
  const auto& api = cu::driver();
  const int slot = static_cast<int>((seq - 1) % 2);
  const auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
  cu::check(api.cuEventRecord(streamSync_, s), "cuEventRecord");
  waitForEvent(streamSync_, deadline, "all_reduce: the stream did not reach the host reduction");
  hostWaitAll(kReady, seq, "all_reduce");
  std::vector<const void*> srcs(world_);
  for (int r = 0; r < world_; ++r) srcs[r] = staging_->hostSlot(r, slot);
  // Private result buffer: peers may still be reading this rank's slots.
  std::vector<char> result(count * hoccl::elementSize(dtype));
  reduceInto(result.data(), srcs.data(), world_, count, dtype, op);
  postScale(result.data(), count, dtype, op, factor, world_);
  // Pageable source: cuMemcpyHtoDAsync stages it and returns once the buffer may be reused.
  cu::check(api.cuMemcpyHtoDAsync(dst, result.data(), result.size(), s), "cuMemcpyHtoDAsync");
  cu::check(api.cuEventRecord(streamSync_, s), "cuEventRecord");
  waitForEvent(streamSync_, deadline, "all_reduce: the result copy did not finish");
  for (int r = 0; r < world_; ++r)
    if (r != rank_) flags(kDone).hostSignal(r, seq);
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
