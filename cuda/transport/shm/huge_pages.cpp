#include "transport/shm/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

namespace hoccl {
namespace {

constexpr uintptr_t kHugePage = 2u << 20;
constexpr size_t kSeenCapacity = 64;       // distinct ranges of recent ops
constexpr size_t kPromotedCapacity = 1024;  // ranges never collapsed twice (FIFO past this)
std::atomic<uint64_t> promotedBytes{0};

// Collapses the 2 MiB pages lying wholly inside [start, start + bytes); returns their bytes,
// 0 when the kernel refuses (no THP, older kernel, no free huge page): promotion is best-effort.
uint64_t collapse(uintptr_t start, size_t bytes) {
  uintptr_t lo = (start + kHugePage - 1) & ~(kHugePage - 1);
  uintptr_t hi = (start + bytes) & ~(kHugePage - 1);
  if (hi <= lo) return 0;
  if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_COLLAPSE) != 0) return 0;
  promotedBytes += hi - lo;
  return hi - lo;
}

}  // namespace

uint64_t HugePagePromoter::bytesPromoted() { return promotedBytes.load(); }

uint64_t HugePagePromoter::notePeerReadable(std::vector<std::pair<const char*, size_t>> spans) {
  if (minBytes_ <= 0 || spans.empty()) return 0;
  std::sort(spans.begin(), spans.end());
  uint64_t done = 0;
  Range cur{0, 0};
  for (const auto& [p, n] : spans) {
    if (n == 0) continue;
    auto start = reinterpret_cast<uintptr_t>(p);
    if (cur.bytes > 0 && start <= cur.start + cur.bytes) {
      cur.bytes = std::max(cur.bytes, start + n - cur.start);
      continue;
    }
    if (cur.bytes > 0) done += note(cur);
    cur = {start, n};
  }
  if (cur.bytes > 0) done += note(cur);
  return done;
}

uint64_t HugePagePromoter::note(Range r) {
  if (static_cast<int64_t>(r.bytes) < minBytes_) return 0;
  if (std::find(promoted_.begin(), promoted_.end(), r) != promoted_.end()) return 0;
  auto seen = std::find(seenOnce_.begin(), seenOnce_.end(), r);
  if (seen == seenOnce_.end()) {
    seenOnce_.push_back(r);
    if (seenOnce_.size() > kSeenCapacity) seenOnce_.pop_front();
    return 0;
  }
  seenOnce_.erase(seen);
  promoted_.push_back(r);
  if (promoted_.size() > kPromotedCapacity) promoted_.pop_front();
  return collapse(r.start, r.bytes);
}

}  // namespace hoccl
