#include "transport/ce/ce_copy.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <unistd.h>

namespace hoccl {

CePathMode parseCePathMode(const std::string& value) {
  if (value.empty() || value == "auto") return CePathMode::Auto;
  if (value == "p2p") return CePathMode::P2P;
  if (value == "host") return CePathMode::Host;
  throw std::invalid_argument("hoccl: HOCCL_CE_PATH must be auto, p2p or host, got '" + value + "'");
}

CePathMode cePathModeFromEnv() {
  const char* v = std::getenv("HOCCL_CE_PATH");
  return parseCePathMode(v ? v : "");
}

const char* cePathName(CePath p) { return p == CePath::P2P ? "p2p" : "host"; }

CePath choosePath(CePathMode mode, bool sameDevice, bool canAccessPeer, int driverVersion) {
  if (mode == CePathMode::P2P) return CePath::P2P;  // forced: IPC works on one device too
  if (mode == CePathMode::Host) return CePath::Host;
  if (sameDevice) return driverVersion >= kSameDeviceCeDriverVersion ? CePath::P2P : CePath::Host;
  return canAccessPeer ? CePath::P2P : CePath::Host;
}

#ifdef HOCCL_WITH_CUDA

namespace {

std::vector<uint8_t> toBytes(const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  return {b, b + n};
}

std::string localBusId(int ordinal) {
  const auto& api = cu::driver();
  CUdevice dev;
  cu::check(api.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  char buf[64] = {0};
  cu::check(api.cuDeviceGetPCIBusId(buf, sizeof(buf), dev), "cuDeviceGetPCIBusId");
  return buf;
}

// The ordinal in this process of the device with `busId`, or -1 if it is not visible.
int ordinalOfBusId(const std::string& busId) {
  int count = 0;
  cu::check(cu::driver().cuDeviceGetCount(&count), "cuDeviceGetCount");
  for (int i = 0; i < count; ++i)
    if (localBusId(i) == busId) return i;
  return -1;
}

bool batchCopy(CUstream stream, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  const auto& api = cu::driver();
  if (!api.cuMemcpyBatchAsync) return false;
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;  // ordinary stream semantics
  attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  size_t attrIdx = 0;
  return api.cuMemcpyBatchAsync(&dst, &src, &bytes, 1, &attr, &attrIdx, 1, stream) == CUDA_SUCCESS;
}

}  // namespace

void ceCopyAsync(CUstream stream, CUdeviceptr dst, CUdeviceptr src, size_t bytes, bool preferCopyEngine) {
  if (bytes == 0) return;
  // The hint only matters (and is only honoured) from CUDA 13.1; fall back on any refusal.
  if (preferCopyEngine && cu::driver().driverVersion >= kSameDeviceCeDriverVersion &&
      batchCopy(stream, dst, src, bytes))
    return;
  cu::check(cu::driver().cuMemcpyAsync(dst, src, bytes, stream), "cuMemcpyAsync");
}

std::vector<PeerInfo> discoverPeers(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                    int rank, int world, int device, CePathMode mode,
                                    std::chrono::milliseconds timeout) {
  cu::ContextGuard guard(device);
  const auto& api = cu::driver();
  const std::string mine = localBusId(device);
  store->set(prefix + "/bus/" + std::to_string(rank), toBytes(mine.data(), mine.size()));
  CUdevice self;
  cu::check(api.cuDeviceGet(&self, device), "cuDeviceGet");
  std::vector<PeerInfo> peers(world);
  for (int r = 0; r < world; ++r) {
    const std::string key = prefix + "/bus/" + std::to_string(r);
    store->wait({key}, timeout);
    auto v = store->get(key);
    PeerInfo& p = peers[r];
    p.busId.assign(v.begin(), v.end());
    p.sameDevice = p.busId == mine;
    p.localOrdinal = p.sameDevice ? device : ordinalOfBusId(p.busId);
    if (!p.sameDevice && p.localOrdinal >= 0) {
      CUdevice other;
      int can = 0;
      cu::check(api.cuDeviceGet(&other, p.localOrdinal), "cuDeviceGet");
      cu::check(api.cuDeviceCanAccessPeer(&can, self, other), "cuDeviceCanAccessPeer");
      p.canAccessPeer = can != 0;
    }
    p.path = choosePath(mode, p.sameDevice, p.canAccessPeer, api.driverVersion);
    // A forced p2p to a GPU this process cannot see cannot work: say so now, not mid-op.
    if (p.path == CePath::P2P && !p.sameDevice && p.localOrdinal < 0)
      throw std::runtime_error("hoccl: HOCCL_CE_PATH=p2p but rank " + std::to_string(r) + "'s GPU " + p.busId +
                               " is not visible to rank " + std::to_string(rank));
  }
  return peers;
}

IpcDesc IpcRegistry::describe(CUdeviceptr ptr, size_t bytes) const {
  cu::ContextGuard guard(device_);
  const auto& api = cu::driver();
  IpcDesc d{};
  CUdeviceptr base = 0;
  size_t size = 0;
  cu::check(api.cuMemGetAddressRange(&base, &size, ptr), "cuMemGetAddressRange");
  if (ptr + bytes > base + size)
    throw std::invalid_argument("hoccl: buffer runs past the end of its CUDA allocation");
  cu::check(api.cuIpcGetMemHandle(&d.handle, base), "cuIpcGetMemHandle");
  d.base = base;
  d.offset = ptr - base;
  d.bytes = bytes;
  d.pid = static_cast<int32_t>(getpid());
  d.device = device_;
  return d;
}

CUdeviceptr IpcRegistry::map(int peer, const IpcDesc& desc) {
  std::pair<int, std::string> key{peer, std::string(reinterpret_cast<const char*>(desc.handle.reserved),
                                                   sizeof(desc.handle.reserved))};
  auto it = mappings_.find(key);
  if (it == mappings_.end()) {
    // A handle cannot be opened by the process that exported it (FACTS); self uses its pointer.
    if (desc.pid == static_cast<int32_t>(getpid()))
      return static_cast<CUdeviceptr>(desc.base + desc.offset);
    cu::ContextGuard guard(device_);
    CUdeviceptr base = 0;
    cu::check(cu::driver().cuIpcOpenMemHandle(&base, desc.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              "cuIpcOpenMemHandle");
    it = mappings_.emplace(std::move(key), base).first;
  }
  return it->second + desc.offset;
}

IpcRegistry::~IpcRegistry() {
  if (mappings_.empty()) return;
  try {
    cu::ContextGuard guard(device_);
    for (auto& kv : mappings_) cu::driver().cuIpcCloseMemHandle(kv.second);
  } catch (...) {
    // Teardown: the driver may already be shutting down.
  }
}

std::vector<IpcDesc> exchangeIpc(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int rank,
                                 int world, const IpcDesc& mine, std::chrono::milliseconds timeout) {
  store->set(key + "/" + std::to_string(rank), toBytes(&mine, sizeof(mine)));
  std::vector<IpcDesc> all(world);
  for (int r = 0; r < world; ++r) {
    if (r == rank) {
      all[r] = mine;
      continue;
    }
    const std::string k = key + "/" + std::to_string(r);
    store->wait({k}, timeout);
    auto v = store->get(k);
    if (v.size() != sizeof(IpcDesc))
      throw std::runtime_error("hoccl: malformed IPC descriptor from rank " + std::to_string(r));
    std::memcpy(&all[r], v.data(), sizeof(IpcDesc));
  }
  return all;
}

HostStaging::HostStaging(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                         int world, size_t slotBytes, int slots, int device, std::chrono::milliseconds timeout)
    : slotBytes_((slotBytes + 4095) / 4096 * 4096),
      slots_(slots),
      region_(store, prefix, rank, world, static_cast<size_t>(world) * slots * ((slotBytes + 4095) / 4096 * 4096),
              device, timeout) {}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
