#include "transport/ce/ce_ipc.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

// One announced region; bytes 0: not announced.
struct IpcExchange::Entry {
  uint64_t bufferId, base, allocBytes, offset, bytes;
};

struct IpcExchange::Announcement {
  uint32_t seq;  // written last: the entry is valid for op `seq`
  uint32_t pad;
  Entry region[kIpcRegions];
};

namespace {

constexpr int kRing = 2;
constexpr size_t kRowBytes = 256;  // kRing announcements + the reader's progress word
static_assert(kRing * sizeof(uint64_t) * (1 + 5 * kIpcRegions) + sizeof(uint32_t) <= kRowBytes, "announcement row");

const char* regionName(int i) { return i == 0 ? "input" : "output"; }

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

// Publishes the handle of allocation `id` once. An older export that is gone (the new one
// overlaps its range, or the driver no longer knows it by its id) is deleted once every peer has
// read past the last op that named it; checked only on new exports, which steady state lacks.
void IpcExchange::exportBuffer(uint64_t id, uint64_t base, uint64_t bytes, uint32_t seq) {
  auto it = exported_.find(id);
  if (it == exported_.end()) {
    auto gone = [&](uint64_t oldId, const Exported& e) {
      if (e.base < base + bytes && base < e.base + e.bytes) return true;
      unsigned long long now = 0;
      return cu::driver().cuPointerGetAttribute(&now, CU_POINTER_ATTRIBUTE_BUFFER_ID, e.base) != CUDA_SUCCESS ||
             now != oldId;
    };
    for (auto old = exported_.begin(); old != exported_.end();) {
      if (gone(old->first, old->second)) {
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

void IpcExchange::retire(CUdeviceptr mapped, CUstream stream) {
  const auto& api = cu::driver();
  Retired r{mapped, nullptr};
  cu::check(api.cuEventCreate(&r.done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  cu::check(api.cuEventRecord(r.done, stream), "cuEventRecord");
  retired_.push_back(r);
}

CUdeviceptr IpcExchange::mapPeer(int peer, const Entry& e, CUstream stream) {
  auto& cache = mappings_[peer];
  for (size_t i = 0; i < cache.size(); ++i)
    if (cache[i].bufferId == e.bufferId) {
      Mapping hit = cache[i];
      cache.erase(cache.begin() + i);
      cache.push_back(hit);  // most recently used last
      return hit.mapped;
    }
  const auto& api = cu::driver();
  // A new allocation over an old one's range means the old one was freed: retire its mapping,
  // to be closed once the copies already issued out of it are done.
  for (size_t i = 0; i < cache.size();) {
    if (cache[i].base < e.base + e.allocBytes && e.base < cache[i].base + cache[i].bytes) {
      retire(cache[i].mapped, stream);
      cache.erase(cache.begin() + i);
    } else {
      ++i;
    }
  }
  // A freed allocation whose range is never reused would otherwise stay mapped for good.
  if (cache.size() >= kIpcMappingsPerPeer) {
    retire(cache.front().mapped, stream);
    cache.erase(cache.begin());
  }
  const std::string k = key(peer, e.bufferId);
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
  cache.push_back(Mapping{e.bufferId, e.base, e.allocBytes, mapped});
  return mapped;
}

IpcExchange::Entry IpcExchange::describe(const IpcRegion& region, uint32_t seq) {
  if (region.bytes == 0) return Entry{};
  const auto& api = cu::driver();
  CUdeviceptr base = 0;
  size_t allocBytes = 0;
  unsigned long long id = 0;
  cu::check(api.cuMemGetAddressRange(&base, &allocBytes, region.ptr), "cuMemGetAddressRange");
  if (region.ptr + region.bytes > base + allocBytes)
    throw std::invalid_argument("hoccl: buffer runs past the end of its CUDA allocation");
  cu::check(api.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, region.ptr), "cuPointerGetAttribute");
  exportBuffer(id, base, allocBytes, seq);
  return Entry{id, base, allocBytes, region.ptr - base, region.bytes};
}

std::vector<IpcTargets> IpcExchange::exchange(uint32_t seq, const IpcRegions& mine,
                                              const std::vector<IpcWanted>& wanted, CUstream stream) {
  Entry entries[kIpcRegions];
  for (int i = 0; i < kIpcRegions; ++i) entries[i] = describe(mine[i], seq);

  // The ring entry for `seq` last held seq - kRing: every peer must have read that one.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && !hostSpin([&] { return reached(*readUpTo(r), seq - kRing); }, deadline))
      throw std::runtime_error("hoccl cuda-ce p2p on rank " + std::to_string(rank_) + ": rank " + std::to_string(r) +
                               " stopped reading buffer announcements (op " + std::to_string(seq) + ")");
  Announcement* own = slot(rank_, seq);
  std::memcpy(own->region, entries, sizeof(entries));
  __atomic_store_n(&own->seq, seq, __ATOMIC_RELEASE);

  std::vector<IpcTargets> out(world_);
  for (int peer = 0; peer < world_ && peer < static_cast<int>(wanted.size()); ++peer) {
    if (peer == rank_ || !(wanted[peer][0] || wanted[peer][1])) continue;
    Announcement a = awaitAnnouncement(peer, seq);
    for (int i = 0; i < kIpcRegions; ++i) {
      if (!wanted[peer][i]) continue;
      const Entry& e = a.region[i];
      if (e.bytes == 0)
        throw std::logic_error("hoccl cuda-ce p2p on rank " + std::to_string(rank_) + ": rank " +
                               std::to_string(peer) + " did not announce its " + regionName(i) + " for op " +
                               std::to_string(seq) + ", which this rank's plan reads (the ranks' plans disagree)");
      out[peer][i] = IpcTarget{mapPeer(peer, e, stream) + e.offset, e.bytes};
    }
  }
  std::atomic_thread_fence(std::memory_order_release);
  *readUpTo(rank_) = seq;
  collectGarbage();
  return out;
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
