#include "ce_collectives.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "reduce_kernels.h"

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

// Group-wide AND of "all my pairs are p2p": the reference collectives use one path for the whole
// group, so every rank's staging-publication count stays identical.
bool groupAllP2P(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int world, bool mineP2P,
                 std::chrono::milliseconds timeout) {
  store->add(prefix + "/votes", 1);
  if (!mineP2P) store->add(prefix + "/host_votes", 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store->add(prefix + "/votes", 0) < world) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("hoccl: timed out agreeing on the ce path");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return store->add(prefix + "/host_votes", 0) == 0;
}

// Graph capture would freeze this call's sequence numbers into the graph's memop nodes; on
// replay the GEQ waits would already be satisfied and ranks would race. Refuse clearly.
void refuseCapture(CUstream stream, const char* op) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cu::check(cu::driver().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  if (status != CU_STREAM_CAPTURE_STATUS_NONE)
    throw std::runtime_error(std::string("hoccl ") + op +
                             ": CUDA graph capture is not supported by the cuda-ce transport yet (its "
                             "cross-rank flags carry per-call sequence numbers that a replayed graph would reuse)");
}

}  // namespace

CeGroup::CeGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int world,
                 int device, CeGroupOptions opts)
    : store_(store), prefix_(prefix), rank_(rank), world_(world), device_(device), opts_(opts) {
  peers_ = discoverPeers(store, prefix + "/peers", rank, world, device, opts.pathMode, opts.timeout);
  bool mineP2P = true;
  for (int r = 0; r < world; ++r)
    if (r != rank && peers_[r].path != CePath::P2P) mineP2P = false;
  if (!groupAllP2P(store, prefix + "/path", world, mineP2P, opts.timeout))
    for (auto& p : peers_) p.path = CePath::Host;
  const size_t flagBytes = CeSync::bytesNeeded(world);
  flagRegion_ = std::make_unique<SharedHostRegion>(store, prefix + "/flags", rank, world, flagBytes * kFlagSets,
                                                   device, opts.timeout);
  for (int f = 0; f < kFlagSets; ++f) sync_.push_back(std::make_unique<CeSync>(*flagRegion_, flagBytes * f, rank, world));
  staging_ = std::make_unique<HostStaging>(store, prefix + "/stage", rank, world, opts.slotBytes, 2, device,
                                           opts.timeout);
  ipc_ = std::make_unique<IpcRegistry>(device);
  if (opts.reduceOn == ReduceOn::Gpu) {
    reduce_ = std::make_unique<ReduceKernel>(device, opts.reduceCtas);
    scratch_ = std::make_unique<DeviceBuffer>(staging_->slotBytes() * world, device);
  }
}

CeGroup::~CeGroup() = default;

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

void CeGroup::allGather(CUstream stream, CUdeviceptr out, CUdeviceptr in, size_t bytes) {
  if (bytes == 0) return;
  cu::ContextGuard guard(device_);
  refuseCapture(stream, "all_gather");
  auto p2p = peersOn(CePath::P2P);
  if (world_ > 1 && p2p.size() == static_cast<size_t>(world_ - 1)) return gatherP2P(stream, out, in, bytes, p2p);
  gatherHostChunked(stream, out, in, bytes, everyone());
}

// Publication n of this rank lives in slot (n-1)%2; before overwriting it, every peer must have
// consumed publication n-2 (DONE >= n-2).
void CeGroup::gatherHostChunked(CUstream s, CUdeviceptr out, CUdeviceptr in, size_t bytes,
                                const std::vector<int>& hostPeers) {
  const auto& api = cu::driver();
  for (size_t off = 0; off < bytes; off += staging_->slotBytes()) {
    const size_t len = std::min(staging_->slotBytes(), bytes - off);
    const uint32_t n = ++published_;
    const int slot = static_cast<int>((n - 1) % 2);
    if (n > 2 && !hostPeers.empty())
      flags(kDone).waitMany(s, hostPeers, std::vector<uint32_t>(hostPeers.size(), n - 2));
    cu::check(api.cuMemcpyDtoHAsync(staging_->hostSlot(rank_, slot), in + off, len, s), "cuMemcpyDtoHAsync");
    for (int p : hostPeers) flags(kReady).signal(s, p, n);
    // Own block from the own slot: H2D runs on a copy engine, a same-device D2D might not.
    cu::check(api.cuMemcpyHtoDAsync(out + rank_ * bytes + off, staging_->hostSlot(rank_, slot), len, s),
              "cuMemcpyHtoDAsync");
    for (int p : hostPeers) {
      flags(kReady).wait(s, p, n);
      cu::check(api.cuMemcpyHtoDAsync(out + p * bytes + off, staging_->hostSlot(p, slot), len, s),
                "cuMemcpyHtoDAsync");
      flags(kDone).signal(s, p, n);
    }
  }
}

// Push model: each rank writes its block straight into every peer's output, once the peer says
// its output may be overwritten (ARM), then tells it the data is there (DATA).
void CeGroup::gatherP2P(CUstream s, CUdeviceptr out, CUdeviceptr in, size_t bytes, const std::vector<int>& p2pPeers) {
  const uint32_t seq = ++opSeq_;
  IpcDesc mine = ipc_->describe(out, bytes * world_);
  auto all = exchangeIpc(store_, prefix_ + "/ipc/" + std::to_string(seq), rank_, world_, mine, opts_.timeout);
  for (int p : p2pPeers) flags(kArm).signal(s, p, seq);
  flags(kArm).waitMany(s, p2pPeers, std::vector<uint32_t>(p2pPeers.size(), seq));
  for (int p : p2pPeers) ceCopyAsync(s, ipc_->map(p, all[p]) + rank_ * bytes, in, bytes);
  ceCopyAsync(s, out + rank_ * bytes, in, bytes);
  for (int p : p2pPeers) flags(kData).signal(s, p, seq);
  flags(kData).waitMany(s, p2pPeers, std::vector<uint32_t>(p2pPeers.size(), seq));
}

void CeGroup::allReduce(CUstream stream, CUdeviceptr buf, int64_t count, c10::ScalarType dtype, RedOp op,
                        double factor) {
  if (count == 0) return;
  std::string why = checkReducible(dtype, op);
  if (!why.empty()) throw std::invalid_argument("hoccl all_reduce: " + why);
  cu::ContextGuard guard(device_);
  refuseCapture(stream, "all_reduce");
  const auto& api = cu::driver();
  const size_t elem = hoccl::elementSize(dtype);
  const int64_t chunkElems = static_cast<int64_t>(staging_->slotBytes() / elem);
  const auto peers = everyone();
  for (int64_t first = 0; first < count; first += chunkElems) {
    const int64_t n = std::min(chunkElems, count - first);
    const uint32_t seq = ++published_;
    const int slot = static_cast<int>((seq - 1) % 2);
    if (seq > 2 && !peers.empty()) flags(kDone).waitMany(stream, peers, std::vector<uint32_t>(peers.size(), seq - 2));
    cu::check(api.cuMemcpyDtoHAsync(staging_->hostSlot(rank_, slot), buf + first * elem, n * elem, stream),
              "cuMemcpyDtoHAsync");
    for (int p : peers) flags(kReady).signal(stream, p, seq);
    if (reduce_) reduceChunkGpu(stream, buf + first * elem, n, dtype, op, factor, seq);
    else reduceChunkHost(stream, buf + first * elem, n, dtype, op, factor, seq);
  }
}

void CeGroup::reduceChunkGpu(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op,
                             double factor, uint32_t seq) {
  const auto& api = cu::driver();
  const int slot = static_cast<int>((seq - 1) % 2);
  const size_t bytes = count * hoccl::elementSize(dtype);
  std::vector<CUdeviceptr> srcs(world_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) {
      srcs[r] = dst;  // own data never leaves the device
      continue;
    }
    flags(kReady).wait(s, r, seq);
    srcs[r] = scratch_->ptr(static_cast<size_t>(r) * staging_->slotBytes());
    cu::check(api.cuMemcpyHtoDAsync(srcs[r], staging_->hostSlot(r, slot), bytes, s), "cuMemcpyHtoDAsync");
    flags(kDone).signal(s, r, seq);
  }
  reduce_->launch(s, dst, srcs, count, dtype, op, factor, world_, /*finalize=*/true);
}

void CeGroup::hostWaitAll(Flag f, uint32_t seq, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    if (!flags(f).hostWait(r, seq, deadline))
      throw std::runtime_error(std::string("hoccl ") + what + " on rank " + std::to_string(rank_) +
                               ": timed out waiting for rank " + std::to_string(r));
  }
}

// The CPU reduces straight from the shared slots; it must first see its own D2H finished, and
// must not signal DONE from the host while older stream-ordered DONE writes are still queued
// (the word would go backwards), hence the stream synchronisations.
void CeGroup::reduceChunkHost(CUstream s, CUdeviceptr dst, int64_t count, c10::ScalarType dtype, RedOp op,
                              double factor, uint32_t seq) {
  const auto& api = cu::driver();
  const int slot = static_cast<int>((seq - 1) % 2);
  cu::check(api.cuStreamSynchronize(s), "cuStreamSynchronize");
  hostWaitAll(kReady, seq, "all_reduce");
  std::vector<const void*> srcs(world_);
  for (int r = 0; r < world_; ++r) srcs[r] = staging_->hostSlot(r, slot);
  // Result into the other slot of this rank? Peers may still read it; use a private buffer.
  std::vector<char> result(count * hoccl::elementSize(dtype));
  reduceInto(result.data(), srcs.data(), world_, count, dtype, op);
  postScale(result.data(), count, dtype, op, factor, world_);
  // Pageable source: cuMemcpyHtoDAsync stages it and returns once the buffer may be reused.
  cu::check(api.cuMemcpyHtoDAsync(dst, result.data(), result.size(), s), "cuMemcpyHtoDAsync");
  cu::check(api.cuStreamSynchronize(s), "cuStreamSynchronize");
  for (int r = 0; r < world_; ++r)
    if (r != rank_) flags(kDone).hostSignal(r, seq);
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
