// Copy-engine transfers for the cuda-ce transport (the "channel" layer).
//
// Two paths, chosen per peer pair:
//  * host: D2H into a pinned, shared host staging slot, then the peer copies H2D out of it.
//    Host<->device copies of pinned memory run on copy engines, for any pair of ranks, including
//    several ranks on one GPU (scripts/gpu_checks.py sm_free verifies it on a GPU).
//  * p2p:  one D2D copy between CUDA-IPC-mapped buffers. A same-device D2D copy may be a kernel
//    on the SMs: the driver documents that device-to-device copies may use kernels, and
//    CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (declared since the 12.8 headers; hoccl sends it
//    through cuMemcpyBatchAsync from driver 13.1) is only a hint. Nothing proves it runs on a copy engine, so `auto` never takes p2p between
//    ranks on one GPU.
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

// Driver version from which copies carry the copy-engine hint (a hint: the driver may ignore it).
constexpr int kSameDeviceCeDriverVersion = 13010;

// The pure decision (unit-tested on CPU): forced modes win; auto takes p2p only between
// different GPUs with peer access. Between ranks on one GPU auto takes host on every driver:
// the same-device D2D copy is not proven to use a copy engine (the hint may be ignored), while
// D2H and H2D of pinned memory are. `driverVersion` is kept for callers and reports only.
CePath choosePath(CePathMode mode, bool sameDevice, bool canAccessPeer, int driverVersion);

#ifdef HOCCL_WITH_CUDA

// Which driver call carried a copy (the sm_free check reports it next to the result).
enum class CeCopyCall : int8_t { None, Memcpy, Batch };
const char* ceCopyCallName(CeCopyCall c);

// Enqueues a D2D/D2H/H2D copy on `stream` (unified addressing: cuMemcpyAsync infers the
// direction): the p2p path's copies. With preferCopyEngine on a driver >= 13.1 that has
// cuMemcpyBatchAsync, the copy carries CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (a hint that
// asks for a copy engine; the driver may ignore it). Returns the call that carried it.
CeCopyCall ceCopyAsync(CUstream stream, CUdeviceptr dst, CUdeviceptr src, size_t bytes, bool preferCopyEngine = true);

// The batch variant alone, whatever the driver version: one cuMemcpyBatchAsync with the hint.
// Returns its CUresult (CUDA_ERROR_NOT_SUPPORTED when the driver lacks the entry point).
CUresult ceBatchCopyAsync(CUstream stream, CUdeviceptr dst, CUdeviceptr src, size_t bytes);

// The host path's copies: D2H into pinned host staging, H2D out of it (copy engines).
void ceCopyToHost(CUstream stream, void* hostDst, CUdeviceptr src, size_t bytes);
void ceCopyFromHost(CUstream stream, CUdeviceptr dst, const void* hostSrc, size_t bytes);

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
