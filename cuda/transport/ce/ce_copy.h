// Copy-engine transfers for the cuda-ce transport (the "channel" layer).
//
// Two paths, chosen per peer pair:
//  * host: D2H into a pinned, shared host staging slot, then the peer copies H2D out of it.
//    Host<->device copies of pinned memory always run on copy engines, for any pair of ranks,
//    including several ranks on one GPU.
//  * p2p:  one D2D copy between CUDA-IPC-mapped buffers. Copy engine only across devices with
//    peer access; same-device D2D copies run on SMs unless the driver honours
//    CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (a hint, honoured from CUDA 13.1), so `auto` avoids p2p
//    between ranks on one GPU on older drivers.
// HOCCL_CE_PATH=auto|p2p|host overrides the choice for every pair.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/ce/ce_host_memory.h"
#include "transport/ce/cuda_driver.h"

namespace hoccl {

enum class CePathMode : int8_t { Auto, P2P, Host };
enum class CePath : int8_t { P2P, Host };

// Parses HOCCL_CE_PATH (unset/empty: Auto); throws std::invalid_argument naming the bad value.
CePathMode cePathModeFromEnv();
CePathMode parseCePathMode(const std::string& value);
const char* cePathName(CePath p);

// Driver version from which same-device D2D copies can be put on a copy engine.
constexpr int kSameDeviceCeDriverVersion = 13010;

// The pure decision (unit-tested on CPU): forced modes win; auto takes p2p only where the
// D2D copy runs on a copy engine.
CePath choosePath(CePathMode mode, bool sameDevice, bool canAccessPeer, int driverVersion);

#ifdef HOCCL_WITH_CUDA

// Enqueues a D2D/D2H/H2D copy on `stream` (unified addressing: cuMemcpyAsync infers the
// direction). With preferCopyEngine and a driver that has cuMemcpyBatchAsync, the copy carries
// CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE, which moves same-device copies onto a copy engine
// on CUDA >= 13.1 (a hint; ignored before).
void ceCopyAsync(CUstream stream, CUdeviceptr dst, CUdeviceptr src, size_t bytes, bool preferCopyEngine = true);

// What every rank learns about every other rank's GPU, once per group.
struct PeerInfo {
  std::string busId;     // PCI bus id of the peer's device
  int localOrdinal = -1; // that device's index in this process (-1: not visible here)
  bool sameDevice = false;
  bool canAccessPeer = false;
  CePath path = CePath::Host;
};

// Exchanges PCI bus ids through the Store (`<prefix>/bus/<rank>`) and decides each pair's path.
std::vector<PeerInfo> discoverPeers(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                    int rank, int world, int device, CePathMode mode,
                                    std::chrono::milliseconds timeout);

// Pinned shared host staging: `slots` slots of `slotBytes` per rank, in one SharedHostRegion.
// Rank r's D2H lands in slot(r, i); any rank's copy engine reads it with H2D.
class HostStaging {
 public:
  HostStaging(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int world,
              size_t slotBytes, int slots, int device, std::chrono::milliseconds timeout);
  size_t slotBytes() const { return slotBytes_; }
  int slots() const { return slots_; }
  void* hostSlot(int r, int i, size_t offset = 0) const { return region_.hostPtr(slotOffset(r, i) + offset); }
  CUdeviceptr deviceSlot(int r, int i) const { return region_.devicePtr(slotOffset(r, i)); }

 private:
  size_t slotOffset(int r, int i) const { return (static_cast<size_t>(r) * slots_ + i) * slotBytes_; }
  size_t slotBytes_;
  int slots_;
  SharedHostRegion region_;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
