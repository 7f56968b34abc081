#include "transport/ce/ce_ipc.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

struct IpcExchange::Announcement {
  uint32_t seq;  // written last: the entry is valid for op `seq`
  uint32_t pad;
  uint64_t bufferId, base, allocBytes, offset, bytes;
};

namespace {

constexpr int kRing = 2;
constexpr size_t kRowBytes = 128;  // kRing announcements + the reader's progress word
static_assert(kRing * 48 + sizeof(uint32_t) <= kRowBytes, "announcement row");

bool reached(uint32_t now, uint32_t seq) { return static_cast<int32_t>(now - seq) >= 0; }

// Spins briefly, then sleeps; false once `deadline` passed.
template <typename Pred>
bool hostSpin(Pred done, std::chrono::steady_clock::time_point deadline) {
  for (int spin = 0; !done(); ++spin) {
    if (spin > 1000) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return true;
}

}  // namespace

size_t IpcExchange::bytesNeeded(int world) { return kRowBytes * world; }

IpcExchange::IpcExchange(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                         int world, int device, const SharedHostRegion& region, size_t offset, uint32_t firstSeq,
                         std::chrono::milliseconds timeout)
    : store_(store), prefix_(prefix), rank_(rank), world_(world), device_(device), region_(region),
      offset_(offset), timeout_(timeout), mappings_(world) {
  if (offset + bytesNeeded(world) > region.size())
    throw std::invalid_argument("hoccl: the IPC announcement rings do not fit in the shared host region");
  // Sequence numbers are cyclic: "nothing announced/read yet" must equal the group's first op - 1.
  for (int i = 0; i < kRing; ++i) __atomic_store_n(&slot(rank, i)->seq, firstSeq, __ATOMIC_RELEASE);
  *readUpTo(rank) = firstSeq;
}

IpcExchange::~IpcExchange() {
  try {
    cu::ContextGuard guard(device_);
    const auto& api = cu::driver();
    for (auto& r : retired_) {
      api.cuEventSynchronize(r.done);
      api.cuIpcCloseMemHandle(r.mapped);
      api.cuEventDestroy(r.done);
    }
    for (auto& peer : mappings_)
      for (auto& m : peer) api.cuIpcCloseMemHandle(m.mapped);
    for (auto& kv : exported_) store_->deleteKey(key(rank_, kv.first));
    for (auto& kv : retiredKeys_) store_->deleteKey(key(rank_, kv.first));
  } catch (...) {
    // Teardown: the driver or the store may already be gone; nothing left to recover.
  }
}

IpcExchange::Announcement* IpcExchange::slot(int r, uint32_t seq) const {
  return static_cast<Announcement*>(region_.hostPtr(offset_ + kRowBytes * r + sizeof(Announcement) * (seq % kRing)));
}

volatile uint32_t* IpcExchange::readUpTo(int r) const {
  return static_cast<volatile uint32_t*>(region_.hostPtr(offset_ + kRowBytes * r + kRing * sizeof(Announcement)));
}

std::string IpcExchange::key(int r, uint64_t id) const {
  return prefix_ + "/" + std::to_string(r) + "/" + std::to_string(id);
}

size_t IpcExchange::openMappings() const {
  size_t n = retired_.size();
  for (const auto& peer : mappings_) n += peer.size();
  return n;
}

// Publishes the handle of allocation `id` once; an older export it replaces (same range, so that
// allocation is gone) is deleted once every peer has read past the last op that named it.
void IpcExchange::exportBuffer(uint64_t id, uint64_t base, uint64_t bytes, uint32_t seq) {
  auto it = exported_.find(id);
  if (it == exported_.end()) {
    for (auto old = exported_.begin(); old != exported_.end();) {
      if (old->second.base < base + bytes && base < old->second.base + old->second.bytes) {
        retiredKeys_.emplace_back(old->first, old->second.lastSeq);
        old = exported_.erase(old);
      } else {
        ++old;
      }
    }
    CUipcMemHandle handle;
    cu::check(cu::driver().cuIpcGetMemHandle(&handle, base), "cuIpcGetMemHandle");
    const auto* b = reinterpret_cast<const uint8_t*>(&handle);
    store_->set(key(rank_, id), std::vector<uint8_t>(b, b + sizeof(handle)));
    it = exported_.emplace(id, Exported{base, bytes, seq}).first;
  }
  it->second.lastSeq = seq;
}

void IpcExchange::collectGarbage() {
  const auto& api = cu::driver();
  for (size_t i = 0; i < retired_.size();) {
    if (api.cuEventQuery(retired_[i].done) == CUDA_SUCCESS) {
      api.cuIpcCloseMemHandle(retired_[i].mapped);
      api.cuEventDestroy(retired_[i].done);
      retired_.erase(retired_.begin() + i);
    } else {
      ++i;
    }
  }
  for (size_t i = 0; i < retiredKeys_.size();) {
    bool everyoneRead = true;
    for (int r = 0; r < world_; ++r)
      if (r != rank_ && !reached(*readUpTo(r), retiredKeys_[i].second)) everyoneRead = false;
    if (everyoneRead) {
      store_->deleteKey(key(rank_, retiredKeys_[i].first));
      retiredKeys_.erase(retiredKeys_.begin() + i);
    } else {
      ++i;
    }
  }
}

IpcExchange::Announcement IpcExchange::awaitAnnouncement(int peer, uint32_t seq) const {
  Announcement* a = slot(peer, seq);
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  if (!hostSpin([&] { return __atomic_load_n(&a->seq, __ATOMIC_ACQUIRE) == seq; }, deadline))
    throw std::runtime_error("hoccl cuda-ce p2p on rank " + std::to_string(rank_) + ": rank " + std::to_string(peer) +
                             " did not announce its buffer for op " + std::to_string(seq) + " within " +
                             std::to_string(timeout_.count()) + " ms (it stopped, or runs a different op sequence)");
  Announcement copy;
  std::memcpy(&copy, a, sizeof(copy));
  return copy;
}

CUdeviceptr IpcExchange::mapPeer(int peer, const Announcement& a, CUstream stream) {
  auto& cache = mappings_[peer];
  for (const auto& m : cache)
    if (m.bufferId == a.bufferId) return m.mapped;
  const auto& api = cu::driver();
  // A new allocation over an old one's range means the old one was freed: retire its mapping,
  // to be closed once the copies already issued into it are done.
  for (size_t i = 0; i < cache.size();) {
    if (cache[i].base < a.base + a.allocBytes && a.base < cache[i].base + cache[i].bytes) {
      Retired r{cache[i].mapped, nullptr};
      cu::check(api.cuEventCreate(&r.done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      cu::check(api.cuEventRecord(r.done, stream), "cuEventRecord");
      retired_.push_back(r);
      cache.erase(cache.begin() + i);
    } else {
      ++i;
    }
  }
  const std::string k = key(peer, a.bufferId);
  store_->wait({k}, timeout_);
  auto bytes = store_->get(k);
  if (bytes.size() != sizeof(CUipcMemHandle))
    throw std::runtime_error("hoccl: malformed IPC handle from rank " + std::to_string(peer));
  CUipcMemHandle handle;
  std::memcpy(&handle, bytes.data(), sizeof(handle));
  CUdeviceptr mapped = 0;
  CUresult r = api.cuIpcOpenMemHandle(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS)
    cu::check(r, ("cuIpcOpenMemHandle (rank " + std::to_string(rank_) + " mapping rank " + std::to_string(peer) +
                  "'s buffer; legacy CUDA IPC may be unsupported here: use HOCCL_CE_PATH=host)")
                     .c_str());
  cache.push_back(Mapping{a.bufferId, a.base, a.allocBytes, mapped});
  return mapped;
}

std::vector<IpcTarget> IpcExchange::exchange(uint32_t seq, CUdeviceptr mine, size_t bytes,
                                             const std::vector<int>& targets, CUstream stream) {
  const auto& api = cu::driver();
  CUdeviceptr base = 0;
  size_t allocBytes = 0;
  unsigned long long id = 0;
  cu::check(api.cuMemGetAddressRange(&base, &allocBytes, mine), "cuMemGetAddressRange");
  if (mine + bytes > base + allocBytes)
    throw std::invalid_argument("hoccl: buffer runs past the end of its CUDA allocation");
  cu::check(api.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, mine), "cuPointerGetAttribute");
  exportBuffer(id, base, allocBytes, seq);

  // The ring entry for `seq` last held seq - kRing: every peer must have read that one.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && !hostSpin([&] { return reached(*readUpTo(r), seq - kRing); }, deadline))
      throw std::runtime_error("hoccl cuda-ce p2p on rank " + std::to_string(rank_) + ": rank " + std::to_string(r) +
                               " stopped reading buffer announcements (op " + std::to_string(seq) + ")");
  Announcement* own = slot(rank_, seq);
  own->bufferId = id;
  own->base = base;
  own->allocBytes = allocBytes;
  own->offset = mine - base;
  own->bytes = bytes;
  __atomic_store_n(&own->seq, seq, __ATOMIC_RELEASE);

  std::vector<IpcTarget> out(world_);
  for (int peer : targets) {
    Announcement a = awaitAnnouncement(peer, seq);
    out[peer] = IpcTarget{mapPeer(peer, a, stream) + a.offset, a.bytes};
  }
  std::atomic_thread_fence(std::memory_order_release);
  *readUpTo(rank_) = seq;
  collectGarbage();
  return out;
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
