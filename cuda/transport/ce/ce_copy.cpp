#include "transport/ce/ce_copy.h"

#include <cstdlib>
#include <stdexcept>


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

CePath choosePath(CePathMode mode, bool sameDevice, bool canAccessPeer, int /*driverVersion*/) {
  if (mode == CePathMode::P2P) return CePath::P2P;  // forced: IPC works on one device too
  if (mode == CePathMode::Host) return CePath::Host;
  if (sameDevice) return CePath::Host;  // same-device D2D may run on SMs on any driver
  return canAccessPeer ? CePath::P2P : CePath::Host;
}

const char* ceCopyCallName(CeCopyCall c) {
  switch (c) {
    case CeCopyCall::Memcpy: return "cuMemcpyAsync";
    case CeCopyCall::Batch: return "cuMemcpyBatchAsync";
    default: return "none";
  }
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

}  // namespace

CUresult ceBatchCopyAsync(CUstream stream, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  const auto& api = cu::driver();
  if (!api.cuMemcpyBatchAsync) return CUDA_ERROR_NOT_SUPPORTED;
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;  // ordinary stream semantics
  attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  size_t attrIdx = 0;
  return api.cuMemcpyBatchAsync(&dst, &src, &bytes, 1, &attr, &attrIdx, 1, stream);
}

CeCopyCall ceCopyAsync(CUstream stream, CUdeviceptr dst, CUdeviceptr src, size_t bytes, bool preferCopyEngine) {
  if (bytes == 0) return CeCopyCall::None;
  // The flag is declared since the 12.8 headers; hoccl sends it from driver 13.1
  // (kSameDeviceCeDriverVersion) and falls back on any refusal.
  if (preferCopyEngine && cu::driver().driverVersion >= kSameDeviceCeDriverVersion &&
      ceBatchCopyAsync(stream, dst, src, bytes) == CUDA_SUCCESS)
    return CeCopyCall::Batch;
  cu::check(cu::driver().cuMemcpyAsync(dst, src, bytes, stream), "cuMemcpyAsync");
  return CeCopyCall::Memcpy;
}

void ceCopyToHost(CUstream stream, void* hostDst, CUdeviceptr src, size_t bytes) {
  cu::check(cu::driver().cuMemcpyDtoHAsync(hostDst, src, bytes, stream), "cuMemcpyDtoHAsync");
}

void ceCopyFromHost(CUstream stream, CUdeviceptr dst, const void* hostSrc, size_t bytes) {
  cu::check(cu::driver().cuMemcpyHtoDAsync(dst, hostSrc, bytes, stream), "cuMemcpyHtoDAsync");
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

HostStaging::HostStaging(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                         int world, size_t slotBytes, int slots, int device, std::chrono::milliseconds timeout)
    : slotBytes_((slotBytes + 4095) / 4096 * 4096),
      slots_(slots),
      region_(store, prefix, rank, world, static_cast<size_t>(world) * slots * ((slotBytes + 4095) / 4096 * 4096),
              device, timeout) {}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
