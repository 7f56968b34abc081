#include "transport/shm/shared_tensor.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

namespace hoccl {
namespace {

struct Region {
  size_t bytes;
  int fd;
  uint64_t dev, ino;
};

// Every live sharedEmpty() allocation of this process, by base address.
std::mutex registryMutex;
std::map<uintptr_t, Region> registry;
std::atomic<size_t> registrySize{0};
std::atomic<uint64_t> mappedBytesRead{0};

// Regions no op touched for this many ops are unmapped (a peer's freed tensor stays alive
// while it is mapped here).
constexpr uint64_t kIdleOpsBeforeUnmap = 64;

void releaseRegion(void* base) {
  Region region{};
  {
    std::lock_guard<std::mutex> lock(registryMutex);
    auto it = registry.find(reinterpret_cast<uintptr_t>(base));
    if (it == registry.end()) return;
    region = it->second;
    registry.erase(it);
    registrySize.store(registry.size());
  }
  munmap(base, region.bytes);
  close(region.fd);
}

}  // namespace

at::Tensor sharedBytes(int64_t length) {
  TORCH_CHECK(length >= 0, "hoccl.empty: negative size ", length);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t bytes = std::max(page, (static_cast<size_t>(length) + page - 1) / page * page);
  int fd = memfd_create("hoccl-tensor", MFD_CLOEXEC);
  TORCH_CHECK(fd >= 0, "hoccl.empty: memfd_create failed: ", std::strerror(errno));
  struct stat st {};
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    TORCH_CHECK(false, "hoccl.empty: cannot size shared memory of ", bytes, " bytes: ", std::strerror(err));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    close(fd);
    TORCH_CHECK(false, "hoccl.empty: mmap of ", bytes, " bytes failed: ", std::strerror(err));
  }
  {
    std::lock_guard<std::mutex> lock(registryMutex);
    registry[reinterpret_cast<uintptr_t>(base)] =
        Region{bytes, fd, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    registrySize.store(registry.size());
  }
  return at::from_blob(base, {length}, [](void* p) { releaseRegion(p); }, at::TensorOptions().dtype(at::kByte));
}

SharedRegionRef findSharedRegion(const void* p, size_t bytes) {
  SharedRegionRef ref;
  if (registrySize.load(std::memory_order_relaxed) == 0 || p == nullptr) return ref;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(registryMutex);
  auto it = registry.upper_bound(addr);
  if (it == registry.begin()) return ref;
  --it;
  if (addr + bytes > it->first + it->second.bytes) return ref;
  ref.fd = it->second.fd;
  ref.dev = it->second.dev;
  ref.ino = it->second.ino;
  ref.base = it->first;
  ref.bytes = it->second.bytes;
  return ref;
}

bool isShared(const at::Tensor& t) {
  return t.device().is_cpu() && findSharedRegion(t.data_ptr(), static_cast<size_t>(t.nbytes())).fd >= 0;
}

PeerMappings::~PeerMappings() {
  for (auto& [key, m] : maps_)
    if (m.data) munmap(const_cast<char*>(m.data), m.bytes);
}

const char* PeerMappings::resolve(int pid, const SharedRegionRef& ref, uint64_t address, size_t bytes) {
  if (!ref.covers(address, bytes)) return nullptr;
  Key key{pid, ref.dev, ref.ino};
  auto it = maps_.find(key);
  if (it == maps_.end()) {
    Mapping m;
    // Opening /proc/<pid>/fd/<n> needs the same ptrace access as process_vm_readv, which
    // direct-read plans already require. The identity check guards against the owner having
    // closed that fd and reused the number since it published it.
    std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_dev) == ref.dev &&
        static_cast<uint64_t>(st.st_ino) == ref.ino && static_cast<uint64_t>(st.st_size) >= ref.bytes) {
      // MAP_POPULATE: take the page-table fills now, in one pass, not as faults in the copies.
      void* p = mmap(nullptr, ref.bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
      if (p != MAP_FAILED) {
        m.data = static_cast<const char*>(p);
        m.bytes = ref.bytes;
        m.ownerBase = ref.base;
      }
    }
    if (fd >= 0) close(fd);
    it = maps_.emplace(key, m).first;
  }
  Mapping& m = it->second;
  m.lastOp = op_;
  // The same memfd mapped at another address in the owner (not done by sharedEmpty, but cheap
  // to refuse): offsets are relative to the base the owner publishes now.
  if (!m.data || m.ownerBase != ref.base || ref.bytes > m.bytes) return nullptr;
  return m.data + (address - ref.base);
}

void PeerMappings::endOp() {
  ++op_;
  if (op_ % 16 != 0) return;
  for (auto it = maps_.begin(); it != maps_.end();) {
    if (op_ - it->second.lastOp > kIdleOpsBeforeUnmap) {
      if (it->second.data) munmap(const_cast<char*>(it->second.data), it->second.bytes);
      it = maps_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t PeerMappings::bytesRead() { return mappedBytesRead.load(std::memory_order_relaxed); }
void PeerMappings::countRead(size_t bytes) { mappedBytesRead.fetch_add(bytes, std::memory_order_relaxed); }

}  // namespace hoccl
