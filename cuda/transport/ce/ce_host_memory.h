// Host memory every rank of a group maps and every rank's GPU can address: the medium of the
// copy-engine transport's flags (ce_sync) and host staging slots (ce_copy).
//
// Why host memory: copies between device memory and pinned host memory always run on copy
// engines, and stream memory operations on host-mapped words work between any ranks, also when
// several ranks share one GPU (where a D2D copy may run on SMs: nothing documents otherwise).
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>

#include "transport/ce/cuda_driver.h"
#include "transport/shm/shm_segment.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

// RAII page-locking of existing host memory, mapped into the device's address space
// (cuMemHostRegister DEVICEMAP|PORTABLE). Unregisters on destruction.
class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(void* host, size_t bytes, int device);
  HostRegistration(HostRegistration&& o) noexcept { *this = std::move(o); }
  HostRegistration& operator=(HostRegistration&& o) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration() { release(); }

  CUdeviceptr devicePtr(size_t offset = 0) const { return device_ + offset; }
  void* hostPtr(size_t offset = 0) const { return static_cast<char*>(host_) + offset; }

 private:
  void release();
  void* host_ = nullptr;
  CUdeviceptr device_ = 0;
  int deviceIndex_ = -1;
};

// A POSIX shared segment created by rank 0, opened by the others through the Store
// (`<prefix>/name`), unlinked once all have mapped it, then registered with the local GPU.
// Starts zeroed (ftruncate), which is what ce_sync's flags rely on.
class SharedHostRegion {
 public:
  SharedHostRegion(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                   int world, size_t bytes, int device, std::chrono::milliseconds timeout);
  SharedHostRegion(const SharedHostRegion&) = delete;
  SharedHostRegion& operator=(const SharedHostRegion&) = delete;

  size_t size() const { return segment_.size(); }
  void* hostPtr(size_t offset = 0) const { return static_cast<char*>(segment_.data()) + offset; }
  CUdeviceptr devicePtr(size_t offset = 0) const { return registration_.devicePtr(offset); }

 private:
  ShmSegment segment_;
  HostRegistration registration_;  // destroyed first: unregister before unmapping
};

// Pinned, device-mapped host memory private to this process, of the same kind as the staging
// slots (a /dev/shm mapping, unlinked at once, registered like SharedHostRegion): what the sm_free
// check copies to and from, so its D2H/H2D are the transport's. Starts zeroed.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer(size_t bytes, int device);
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  void* hostPtr(size_t offset = 0) const { return static_cast<char*>(segment_.data()) + offset; }
  CUdeviceptr devicePtr(size_t offset = 0) const { return registration_.devicePtr(offset); }

 private:
  ShmSegment segment_;
  HostRegistration registration_;  // destroyed first: unregister before unmapping
};

// RAII device allocation (cuMemAlloc) for scratch space the reduction reads from.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, int device);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  CUdeviceptr ptr(size_t offset = 0) const { return ptr_ + offset; }

 private:
  CUdeviceptr ptr_ = 0;
  int device_ = -1;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
