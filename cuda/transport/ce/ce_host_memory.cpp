#include "transport/ce/ce_host_memory.h"

#include <stdexcept>
#include <thread>

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

HostRegistration::HostRegistration(void* host, size_t bytes, int device) : deviceIndex_(device) {
  const auto& api = cu::driver();
  cu::ContextGuard guard(device);
  // PORTABLE: valid in every context of this process; DEVICEMAP: gives the GPU an address for it,
  // which cuStreamWaitValue32 and the copy engines use.
  cu::check(api.cuMemHostRegister(host, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
            "cuMemHostRegister");
  host_ = host;
  CUresult r = api.cuMemHostGetDevicePointer(&device_, host, 0);
  if (r != CUDA_SUCCESS) {
    api.cuMemHostUnregister(host);
    host_ = nullptr;
    cu::check(r, "cuMemHostGetDevicePointer");
  }
}

HostRegistration& HostRegistration::operator=(HostRegistration&& o) noexcept {
  if (this != &o) {
    release();
    host_ = o.host_;
    device_ = o.device_;
    deviceIndex_ = o.deviceIndex_;
    o.host_ = nullptr;
    o.device_ = 0;
  }
  return *this;
}

void HostRegistration::release() {
  if (!host_) return;
  try {
    cu::ContextGuard guard(deviceIndex_);
    cu::driver().cuMemHostUnregister(host_);
  } catch (...) {
    // Destructor path: the process is going away or the driver is gone; nothing to recover.
  }
  host_ = nullptr;
}

namespace {

std::vector<uint8_t> toBytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string fromBytes(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
size_t pageAlign(size_t v) { return (v + 4095) / 4096 * 4096; }

}  // namespace

SharedHostRegion::SharedHostRegion(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                   int rank, int world, size_t bytes, int device,
                                   std::chrono::milliseconds timeout) {
  bytes = pageAlign(bytes);
  const std::string nameKey = prefix + "/name";
  const std::string mappedKey = prefix + "/mapped";
  if (rank == 0) {
    segment_ = ShmSegment::create(bytes);
    store->set(nameKey, toBytes(segment_.name()));
  } else {
    store->wait({nameKey}, timeout);
    segment_ = ShmSegment::open(fromBytes(store->get(nameKey)), bytes);
  }
  // Unlink as soon as everyone has mapped it: a crash later cannot leave it in /dev/shm.
  store->add(mappedKey, 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store->add(mappedKey, 0) < world) {
    if (std::chrono::steady_clock::now() > deadline) {
      segment_.unlink();
      throw std::runtime_error("hoccl: rank " + std::to_string(rank) + " timed out waiting for all ranks to map " +
                               prefix);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  segment_.unlink();
  try {
    registration_ = HostRegistration(segment_.data(), segment_.size(), device);
  } catch (const std::runtime_error& e) {
    // Sandboxed runtimes (gVisor) may refuse to page-lock shared mappings: say what and where.
    throw std::runtime_error("hoccl cuda-ce on rank " + std::to_string(rank) + ": cannot page-lock the " +
                             std::to_string(segment_.size()) + "-byte shared host region " + prefix +
                             " (a /dev/shm mapping) for GPU " + std::to_string(device) + ": " + e.what() +
                             "; the copy-engine transport needs cuMemHostRegister of shared memory "
                             "(HOCCL_CUDA_TRANSPORT=host stages CUDA tensors through private pinned memory instead)");
  }
}

PinnedHostBuffer::PinnedHostBuffer(size_t bytes, int device) : segment_(ShmSegment::create(pageAlign(bytes))) {
  segment_.unlink();  // private: no other process needs the name
  registration_ = HostRegistration(segment_.data(), segment_.size(), device);
}

DeviceBuffer::DeviceBuffer(size_t bytes, int device) : device_(device) {
  cu::ContextGuard guard(device);
  cu::check(cu::driver().cuMemAlloc(&ptr_, bytes), "cuMemAlloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  try {
    cu::ContextGuard guard(device_);
    cu::driver().cuMemFree(ptr_);
  } catch (...) {
    // Teardown: the context may already be gone.
  }
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
