#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>

namespace hoccl {
namespace {

std::string randomName() {
  // /dev/urandom-backed: names must not be guessable by other users of the host.
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string name = "/hoccl-";
  for (int i = 0; i < 24; ++i) name += hex[rd() & 15];
  return name;
}

[[noreturn]] void fail(const std::string& what, const std::string& name) {
  throw std::runtime_error("hoccl: " + what + " of shared-memory segment " + name +
                           " failed: " + std::strerror(errno));
}

void* mapFd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap", name);
  return p;
}

}  // namespace

ShmSegment ShmSegment::create(size_t bytes) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::string name = randomName();
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) fail("shm_open", name);
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int saved = errno;
      close(fd);
      shm_unlink(name.c_str());
      errno = saved;
      fail("ftruncate (is /dev/shm large enough?)", name);
    }
    void* p = nullptr;
    try {
      p = mapFd(fd, bytes, name);
    } catch (...) {
      close(fd);
      shm_unlink(name.c_str());
      throw;
    }
    close(fd);
    return ShmSegment(name, p, bytes, true);
  }
  throw std::runtime_error("hoccl: could not find a free shared-memory name");
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail("shm_open", name);
  void* p = nullptr;
  try {
    p = mapFd(fd, bytes, name);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  return ShmSegment(name, p, bytes, false);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : name_(std::move(o.name_)), data_(o.data_), bytes_(o.bytes_), owner_(o.owner_) {
  o.data_ = nullptr;
  o.owner_ = false;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    release();
    name_ = std::move(o.name_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    owner_ = o.owner_;
    o.data_ = nullptr;
    o.owner_ = false;
  }
  return *this;
}

void ShmSegment::unlink() {
  if (owner_) {
    shm_unlink(name_.c_str());  // ENOENT is fine: already gone
    owner_ = false;
  }
}

void ShmSegment::release() {
  unlink();
  if (data_) munmap(data_, bytes_);
  data_ = nullptr;
}

ShmSegment::~ShmSegment() { release(); }

}  // namespace hoccl
