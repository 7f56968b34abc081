// Device allocations (memfd), host registration, IPC and copies of the CPU driver model.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "model.h"

namespace model {
namespace {

struct Range {
  uintptr_t base = 0;
  size_t size = 0;
  uint64_t bufferId = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per allocation in this process
  int fd = -1;            // allocations: the memfd that IPC exports
  int refs = 0;           // IPC mappings: opens by this process of one handle
  uint64_t ipcKey = 0;    // IPC mappings: exporter pid << 32 | exporter buffer id
};

struct Registration {
  uintptr_t host = 0;
  size_t size = 0;
  uintptr_t device = 0;  // a second mapping of the same pages when the memory is shareable
};

// Plain bytes inside CUipcMemHandle::reserved (64 bytes).
struct HandleBytes {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t bufferId;
  uint64_t size;
};
static_assert(sizeof(HandleBytes) <= sizeof(CUipcMemHandle), "handle layout");
constexpr char kMagic[8] = {'h', 'o', 'c', 'c', 'l', 'm', 'd', 'l'};

std::mutex mu;
std::map<uintptr_t, Range> allocations;  // by base
std::map<uintptr_t, Range> ipcMappings;  // by base
std::map<uintptr_t, Registration> registrations;  // by host base
uint64_t nextBufferId = 1;

size_t pageRound(size_t n) { return (n + 4095) / 4096 * 4096; }

std::string memfdName(uint64_t id) { return "hoccl-model-" + std::to_string(getpid()) + "-" + std::to_string(id); }

template <typename Map>
const Range* within(const Map& m, uintptr_t p, size_t bytes) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  const Range& r = it->second;
  return p >= r.base && p + bytes <= r.base + r.size ? &r : nullptr;
}

bool overlapsRegistration(uintptr_t p, size_t bytes) {
  for (const auto& kv : registrations)
    if (p < kv.second.host + kv.second.size && kv.second.host < p + bytes) return true;
  return false;
}

}  // namespace

bool isDevice(CUdeviceptr p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  if (within(allocations, p, bytes) || within(ipcMappings, p, bytes)) return true;
  for (const auto& kv : registrations)
    if (p >= kv.second.device && p + bytes <= kv.second.device + kv.second.size) return true;
  return false;
}

bool isDeviceMemory(CUdeviceptr p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  return within(allocations, p, bytes) || within(ipcMappings, p, bytes);
}

namespace {

// A copy as a kernel (HOCCL_MODEL_D2D_ON_SMS): it runs once one block fits on the SMs of the
// device it was issued on, and holds that block while it copies.
std::function<void()> onSms(std::function<void()> copy) {
  const int device = currentDevice();
  return [device, copy] {
    auto where = placeBlocks(device, 1, 256);
    copy();
    releaseBlocks(device, where, 256);
  };
}

bool needsSms(const void* dst, const void* src, size_t bytes) {
  return d2dOnSms() && isDeviceMemory(reinterpret_cast<CUdeviceptr>(dst), bytes) &&
         isDeviceMemory(reinterpret_cast<CUdeviceptr>(src), bytes);
}

}  // namespace

bool isPinnedHost(const void* ptr, size_t bytes) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& kv : registrations)
    if (p >= kv.second.host && p + bytes <= kv.second.host + kv.second.size) return true;
  return false;
}

CUresult copyAsync(void* dst, const void* src, size_t bytes, CUstream s, bool dstDevice, bool srcDevice) {
  if (bytes == 0) return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
  const bool srcPageable = !srcDevice && !isPinnedHost(src, bytes);
  const bool dstPageable = !dstDevice && !isPinnedHost(dst, bytes);
  count(srcDevice && dstDevice ? "copies_d2d" : srcDevice ? "copies_d2h" : dstDevice ? "copies_h2d" : "copies_h2h");
  if (dstPageable) {
    // Documented: a copy into pageable host memory returns only once it has completed.
    if (CUresult r = cuStreamSynchronize(s); r != CUDA_SUCCESS) return r;
    std::memcpy(dst, src, bytes);
    return CUDA_SUCCESS;
  }
  if (srcPageable) {
    // Documented: the stream is synchronised, the pageable source is staged, then the call
    // returns (the DMA to the destination may still be pending).
    if (CUresult r = cuStreamSynchronize(s); r != CUDA_SUCCESS) return r;
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    return enqueue(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  }
  std::function<void()> copy = [dst, src, bytes] { std::memmove(dst, src, bytes); };
  return enqueue(s, needsSms(dst, src, bytes) ? onSms(copy) : copy);
}

}  // namespace model

using namespace model;

namespace model {
namespace {

// Page-locking needs every page backed: the driver populates the range, so pages that cannot be
// backed (a full /dev/shm tmpfs, a mapping past its file's end) fail the registration with
// CUDA_ERROR_OUT_OF_MEMORY, one of the codes cuMemHostRegister documents.
CUresult pinPages(void* p, size_t bytes, unsigned flags) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095};
  const size_t len = pageRound(reinterpret_cast<uintptr_t>(p) + bytes - start);
  const int advice = (flags & CU_MEMHOSTREGISTER_READ_ONLY) ? MADV_POPULATE_READ : MADV_POPULATE_WRITE;
  if (madvise(reinterpret_cast<void*>(start), len, advice) == 0) return CUDA_SUCCESS;
  if (errno == EINVAL) return CUDA_SUCCESS;  // a kernel without MADV_POPULATE_*: nothing to learn
  return errno == ENOMEM || errno == EFAULT ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace
}  // namespace model

extern "C" {

CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu);
  const uint64_t id = nextBufferId++;
  int fd = memfd_create(memfdName(id).c_str(), 0);  // inheritable: peers open it via /proc
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t size = pageRound(bytes);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Uninitialised device memory: never hand out zeros a caller might come to rely on.
  std::memset(p, 0xA5, size);
  Range r;
  r.base = reinterpret_cast<uintptr_t>(p);
  r.size = bytes;
  r.bufferId = id;
  r.fd = fd;
  allocations[r.base] = r;
  *dptr = r.base;
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations.find(dptr);
  if (it == allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(it->second.base), pageRound(it->second.size));
  close(it->second.fd);
  allocations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(mu);
  const Range* r = within(allocations, dptr, 1);
  if (!r) r = within(ipcMappings, dptr, 1);
  if (!r) return CUDA_ERROR_NOT_FOUND;
  if (pbase) *pbase = r->base;
  if (psize) *psize = r->size;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu);
  const Range* r = within(allocations, ptr, 1);
  if (!r) r = within(ipcMappings, ptr, 1);
  if (!r) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data) = r->bufferId; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = r->base; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = r->size; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = injected("REGISTER"); r != CUDA_SUCCESS) return r;
  if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const auto host = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu);
  if (overlapsRegistration(host, bytes)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (CUresult r = pinPages(p, bytes, flags); r != CUDA_SUCCESS) return r;
  Registration reg{host, bytes, host};
  if (flags & CU_MEMHOSTREGISTER_DEVICEMAP) {
    // A shareable mapping gets a second address for the device (mremap with old_size 0); other
    // memory keeps its host address, which the documentation also allows.
    if (host % 4096 == 0) {
      void* alias = mremap(p, 0, pageRound(bytes), MREMAP_MAYMOVE);
      if (alias != MAP_FAILED) reg.device = reinterpret_cast<uintptr_t>(alias);
    }
  } else {
    reg.device = 0;  // not mapped for the device: cuMemHostGetDevicePointer fails
  }
  registrations[host] = reg;
  count("host_registrations");
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void* p) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(mu);
  auto it = registrations.find(reinterpret_cast<uintptr_t>(p));
  if (it == registrations.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  if (it->second.device && it->second.device != it->second.host)
    munmap(reinterpret_cast<void*>(it->second.device), pageRound(it->second.size));
  registrations.erase(it);
  count("host_registrations", -1);
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr* pdptr, void* p, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (!pdptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const auto host = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& kv : registrations) {
    const Registration& r = kv.second;
    if (host >= r.host && host < r.host + r.size) {
      if (!r.device) return CUDA_ERROR_INVALID_VALUE;
      *pdptr = r.device + (host - r.host);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = injected("IPC_GET"); r != CUDA_SUCCESS) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations.find(dptr);  // documented: the base of an allocation
  if (it == allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  HandleBytes h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.pid = getpid();
  h.fd = it->second.fd;
  h.bufferId = it->second.bufferId;
  h.size = it->second.size;
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &h, sizeof(h));
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = injected("IPC_OPEN"); r != CUDA_SUCCESS) return r;
  if (!pdptr || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  HandleBytes h;
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return CUDA_ERROR_INVALID_HANDLE;
  if (h.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // a process cannot open its own handle
  const uint64_t key = (static_cast<uint64_t>(h.pid) << 32) | h.bufferId;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& kv : ipcMappings)
    if (kv.second.ipcKey == key) {  // documented: the same context gets the same pointer, refcounted
      ++kv.second.refs;
      *pdptr = kv.second.base;
      return CUDA_SUCCESS;
    }
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  char target[256] = {0};
  ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  const std::string expected = "/memfd:hoccl-model-" + std::to_string(h.pid) + "-" + std::to_string(h.bufferId) + " ";
  if (n <= 0 || std::string(target, n).rfind(expected, 0) != 0) return CUDA_ERROR_INVALID_HANDLE;  // freed
  int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return CUDA_ERROR_MAP_FAILED;
  void* p = mmap(nullptr, pageRound(h.size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  Range r;
  r.base = reinterpret_cast<uintptr_t>(p);
  r.size = h.size;
  r.bufferId = nextBufferId++;
  r.refs = 1;
  r.ipcKey = key;
  ipcMappings[r.base] = r;
  count("ipc_open_mappings");
  *pdptr = r.base;
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(mu);
  auto it = ipcMappings.find(dptr);
  if (it == ipcMappings.end()) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs == 0) {
    munmap(reinterpret_cast<void*>(it->second.base), pageRound(it->second.size));
    ipcMappings.erase(it);
    count("ipc_open_mappings", -1);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  // Unified addressing: the kind of each end comes from the pointer itself.
  const bool dd = isDevice(dst, bytes);
  const bool sd = isDevice(src, bytes);
  return copyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, s, dd, sd);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream s) {
  if (bytes && !isDevice(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
  return copyAsync(reinterpret_cast<void*>(dst), src, bytes, s, true, false);
}

CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream s) {
  if (bytes && !isDevice(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  return copyAsync(dst, reinterpret_cast<const void*>(src), bytes, s, false, true);
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  if (bytes && (!isDevice(dst, bytes) || !isDevice(src, bytes))) return CUDA_ERROR_INVALID_VALUE;
  return copyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, s, true, true);
}

CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t n, CUmemcpyAttributes* attrs,
                            size_t* attrsIdxs, size_t numAttrs, CUstream s) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (isLegacyDefault(s)) return CUDA_ERROR_INVALID_VALUE;  // documented: not the legacy NULL stream
  if (!dsts || !srcs || !sizes || !attrs || !attrsIdxs || n == 0 || numAttrs == 0 || numAttrs > n ||
      attrsIdxs[0] != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t k = 0; k < numAttrs; ++k) {
    if (k > 0 && attrsIdxs[k] <= attrsIdxs[k - 1]) return CUDA_ERROR_INVALID_VALUE;
    if (attrsIdxs[k] >= n) return CUDA_ERROR_INVALID_VALUE;
    const auto order = attrs[k].srcAccessOrder;
    if (order == CU_MEMCPY_SRC_ACCESS_ORDER_INVALID || order > CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
      return CUDA_ERROR_INVALID_VALUE;
    if (attrs[k].flags & CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE) count("batch_copies_prefer_overlap");
  }
  std::vector<std::pair<CUdeviceptr, CUdeviceptr>> ends;
  std::vector<size_t> lens(sizes, sizes + n);
  bool kernel = false;  // the overlap flag is a hint: with HOCCL_MODEL_D2D_ON_SMS it is ignored
  for (size_t i = 0; i < n; ++i) {
    const bool hostOnly = !isDevice(dsts[i], sizes[i]) && !isDevice(srcs[i], sizes[i]);
    if (hostOnly) return CUDA_ERROR_INVALID_VALUE;
    ends.emplace_back(dsts[i], srcs[i]);
    kernel = kernel || needsSms(reinterpret_cast<void*>(dsts[i]), reinterpret_cast<void*>(srcs[i]), sizes[i]);
  }
  count("batch_copies", static_cast<long long>(n));
  // Documented: no order within a batch, so the model runs the copies in a random order.
  std::function<void()> batch = [ends, lens] {
    std::vector<size_t> order(ends.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(lens.size() * 2654435761u)));
    for (size_t i : order)
      std::memmove(reinterpret_cast<void*>(ends[i].first), reinterpret_cast<const void*>(ends[i].second), lens[i]);
  };
  return enqueue(s, kernel ? onSms(batch) : batch);
}

}  // extern "C"
