// CPU tensors that local peers can map instead of copying through the kernel.
//
// A cross-memory read (process_vm_readv) pins every 4 KiB page of the peer's buffer on every
// call, which holds it near 60 % of memcpy speed. A tensor from sharedEmpty() lives in a
// memfd (anonymous shared memory, never visible in /dev/shm, gone with its last mapping):
// a peer opens it once through /proc/<pid>/fd, maps it, and from then on reads it with plain
// loads. This is hoccl's counterpart of NCCL's registered buffers (ncclMemAlloc).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace hoccl {

// Where a block of memory lives, as published to peers next to its address. fd < 0: ordinary
// private memory (peers must use cross-memory reads).
struct SharedRegionRef {
  int32_t fd = -1;
  int32_t pad = 0;
  uint64_t dev = 0, ino = 0;  // identity of the memfd, checked after the peer opens it
  uint64_t base = 0;          // address of the mapping in the owner
  uint64_t bytes = 0;         // length of the mapping
  // [address, address + len) lies inside this shared region (false for ordinary memory).
  bool covers(uint64_t address, uint64_t len) const {
    return fd >= 0 && bytes > 0 && address >= base && address + len <= base + bytes;
  }
};

// A new uninitialised 1-D uint8 CPU tensor of `bytes` bytes in shared memory (Python views it
// as the dtype and shape the caller asked for).
at::Tensor sharedBytes(int64_t bytes);
// The region holding [p, p + bytes), if it lies wholly inside one sharedEmpty() allocation.
SharedRegionRef findSharedRegion(const void* p, size_t bytes);
bool isShared(const at::Tensor& t);

// A reader's cache of peers' shared regions, mapped read-only. Keyed by the memfd's identity,
// not its fd number: an owner that frees a tensor and allocates another may reuse the number.
class PeerMappings {
 public:
  PeerMappings() = default;
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;
  ~PeerMappings();

  // A local pointer to peer byte `address` (in the peer's address space) valid for `bytes`,
  // or nullptr when the region cannot be mapped (the caller falls back to cross-memory reads).
  const char* resolve(int pid, const SharedRegionRef& ref, uint64_t address, size_t bytes);
  // Once per op: unmaps regions no op used for a while, so a peer's freed tensors are not kept
  // alive by this process for long.
  void endOp();
  static uint64_t bytesRead();  // process-wide count, for tests and HOCCL_DEBUG
  static void countRead(size_t bytes);

 private:
  struct Mapping {
    const char* data = nullptr;  // nullptr: mapping failed, do not retry
    uint64_t bytes = 0, ownerBase = 0;
    uint64_t lastOp = 0;
  };
  using Key = std::tuple<int, uint64_t, uint64_t>;  // pid, dev, ino
  std::map<Key, Mapping> maps_;
  uint64_t op_ = 0;
};

}  // namespace hoccl
