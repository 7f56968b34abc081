// POSIX shared-memory segment with RAII: created 0600 under an unguessable name, mapped,
// and unlinked as soon as every local rank has mapped it (so nothing survives the job).
#pragma once
#include <cstddef>
#include <string>

namespace hoccl {

class ShmSegment {
 public:
  // Creates a new segment of `bytes` under a random name (O_EXCL, mode 0600).
  static ShmSegment create(size_t bytes);
  // Maps an existing segment created by a peer.
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes the name; the mapping stays valid until unmapped. Idempotent.
  void unlink();
  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, void* data, size_t bytes, bool owner)
      : name_(std::move(name)), data_(data), bytes_(bytes), owner_(owner) {}
  void release();

  std::string name_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;  // only the creator unlinks
};

}  // namespace hoccl
