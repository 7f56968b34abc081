// Reused buffers that peers read with process_vm_readv, moved onto transparent huge pages.
//
// A cross-memory read pins the source pages on every call, one 4 KiB page at a time unless the
// memory sits on a 2 MiB huge page. Most large buffers a job communicates are long-lived (DDP
// buckets, FSDP's flat parameters, preallocated all_to_all buffers), so the second time a
// buffer's exact range is published to peers, hoccl asks the kernel to collapse its 2 MiB-aligned
// interior onto huge pages (madvise MADV_COLLAPSE, Linux 6.1+). The contents and every property
// the program can observe stay as they were; only the page size changes. The collapse costs
// about one copy of the range, once per range: a range is never collapsed twice, so a buffer
// that is freed and reallocated at the same address each step does not pay again.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace hoccl {

class HugePagePromoter {
 public:
  // minBytes <= 0 turns promotion off (HOCCL_HUGEPAGE_MIN_BYTES=0).
  explicit HugePagePromoter(int64_t minBytes) : minBytes_(minBytes) {}

  // The op publishes these spans for peers to read. Adjacent spans are merged first (the
  // blocks of one tensor). Returns the bytes collapsed onto huge pages by this call.
  uint64_t notePeerReadable(std::vector<std::pair<const char*, size_t>> spans);
  static uint64_t bytesPromoted();  // process-wide count, for tests and HOCCL_DEBUG

 private:
  struct Range {
    uintptr_t start;
    size_t bytes;
    bool operator==(const Range& o) const { return start == o.start && bytes == o.bytes; }
  };
  uint64_t note(Range r);

  int64_t minBytes_;
  std::deque<Range> seenOnce_;  // published once: promote if it comes back
  std::deque<Range> promoted_;  // done (or refused): never again
};

}  // namespace hoccl
