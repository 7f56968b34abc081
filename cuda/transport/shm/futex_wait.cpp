#include "transport/shm/futex_wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>

namespace hoccl {

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts;
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

namespace {
thread_local std::chrono::microseconds threadSpinFloor{0};
std::atomic<bool> sharedCores{false};
std::atomic<int64_t> yieldWindowMicros{1000};
std::atomic<int64_t> sleeperSliceMicros{0};

void storeIfChanged(std::atomic<int64_t>& word, int64_t value) {
  if (word.load(std::memory_order_relaxed) != value) word.store(value, std::memory_order_relaxed);
}
}  // namespace

// Stores only on a change: every rank's every op calls this, and the line stays shared in caches.
void setCoresShared(bool shared, std::chrono::microseconds yieldWindow, std::chrono::microseconds sleeperSlice) {
  if (sharedCores.load(std::memory_order_relaxed) != shared) sharedCores.store(shared, std::memory_order_relaxed);
  storeIfChanged(yieldWindowMicros, yieldWindow.count());
  storeIfChanged(sleeperSliceMicros, shared ? sleeperSlice.count() : 0);
}

bool coresShared() { return sharedCores.load(std::memory_order_relaxed); }

SpinAtLeast::SpinAtLeast(std::chrono::microseconds spin) : saved_(threadSpinFloor) {
  threadSpinFloor = std::max(saved_, spin);
}

SpinAtLeast::~SpinAtLeast() { threadSpinFloor = saved_; }

namespace {

// struct sched_attr of sched_setattr(2), its first version (48 bytes): glibc does not declare it.
struct SchedAttr {
  uint32_t size;
  uint32_t policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime;  // SCHED_OTHER: the requested slice in ns (0: the default)
  uint64_t deadline;
  uint64_t period;
};

bool readSchedAttr(SchedAttr* attr) {
  *attr = SchedAttr{};
  return syscall(SYS_sched_getattr, 0, attr, static_cast<unsigned>(sizeof(SchedAttr)), 0u) == 0;
}

bool writeSchedAttr(SchedAttr attr) {
  attr.size = sizeof(SchedAttr);
  attr.flags = 0;
  return syscall(SYS_sched_setattr, 0, &attr, 0u) == 0;
}

}  // namespace

ShortSlices::ShortSlices(std::chrono::microseconds slice) {
  if (slice.count() <= 0) return;
  SchedAttr attr;
  if (!readSchedAttr(&attr) || (attr.policy != SCHED_OTHER && attr.policy != SCHED_BATCH)) return;
  savedSliceNs_ = attr.runtime;
  attr.runtime = static_cast<uint64_t>(slice.count()) * 1000;
  changed_ = attr.runtime != savedSliceNs_ && writeSchedAttr(attr);
}

ShortSlices::~ShortSlices() {
  if (!changed_) return;
  SchedAttr attr;
  if (!readSchedAttr(&attr)) return;
  attr.runtime = savedSliceNs_;
  writeSchedAttr(attr);
}

bool YieldGate::open(std::chrono::steady_clock::time_point now) const {
  return now.time_since_epoch().count() >= closedUntil_.load(std::memory_order_relaxed);
}

void YieldGate::noteYield(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds took,
                          bool progressed) {
  if (progressed || took < kLostYield) return;
  lost_.fetch_add(1, std::memory_order_relaxed);
  closedUntil_.store((now + kClosedFor).time_since_epoch().count(), std::memory_order_relaxed);
}

YieldGate processYieldGate;

namespace {
// 64 pause instructions: well under a microsecond.
bool spinBriefly(const std::function<bool()>& ready) {
  for (int i = 0; i < 64; ++i) {
    if (ready()) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  return false;
}
}  // namespace

void waitUntil(const std::function<bool()>& ready, std::atomic<uint32_t>* word,
               std::atomic<uint32_t>* waiters, const std::function<void()>& check,
               std::chrono::microseconds spin) {
  // Phase 1: a short spin catches the common case where the peer is a few hundred ns behind;
  // when ranks have cores of their own, keep spinning for `spin`.
  if (spinBriefly(ready)) return;
  spin = std::max(spin, threadSpinFloor);
  if (spin.count() > 0) {
    auto until = std::chrono::steady_clock::now() + spin;
    while (std::chrono::steady_clock::now() < until)
      if (spinBriefly(ready)) return;
  }
  // Phase 2: yield so an oversubscribed peer (more ranks than cores) gets the CPU. For up to a
  // millisecond on cores only ranks share: a rank that sleeps instead needs a futex wake-up,
  // which on a VM can take longer than the op, while a yield to the peer that shares the core
  // costs a context switch (4 ranks on 2 cores, 4 KiB all_reduce: 45-55 instead of 70-79 us with
  // a 50 us window). Cores shared with other work get none by default (HOCCL_SHARED_YIELD_US): a
  // yield hands the core to a compute thread for its whole slice, and under EEVDF it also pushes
  // the yielder's virtual deadline out, so the futex wake-up that follows no longer preempts
  // (world 2 beside GEMM threads, 1 MiB all_reduce: 1.2-1.4 ms without yields, 6.6 ms after 50 us).
  // A yield the gate judges lost (YieldGate) ends the yielding of every waiter for a while.
  const auto yieldWindow = std::chrono::microseconds(yieldWindowMicros.load(std::memory_order_relaxed));
  const auto start = std::chrono::steady_clock::now();
  for (auto now = start; now - start < yieldWindow && processYieldGate.open(now);) {
    if (ready()) return;
    const uint32_t before = word->load(std::memory_order_acquire);
    sched_yield();
    const auto after = std::chrono::steady_clock::now();
    processYieldGate.noteYield(after, after - now, word->load(std::memory_order_acquire) != before || ready());
    now = after;
  }
  // Phase 3: sleep on the futex; wake at least every 2 ms to run the checks.  A peer may post
  // what we wait for and exit at once (its part of its last collective done), so a check that
  // throws (dead peer, deadline) first looks at ready() again: a condition met just before it
  // wins over the failure.
  auto checked = [&] {
    try {
      check();
    } catch (...) {
      if (ready()) return true;
      throw;
    }
    return false;
  };
  auto lastCheck = std::chrono::steady_clock::now();
  if (checked()) return;
  ShortSlices whileAsleep(std::chrono::microseconds(sleeperSliceMicros.load(std::memory_order_relaxed)));
  while (true) {
    uint32_t seen = word->load(std::memory_order_seq_cst);
    if (ready()) return;
    waiters->fetch_add(1, std::memory_order_seq_cst);
    if (!ready()) futexWait(word, seen, std::chrono::microseconds(2000));
    waiters->fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    auto now = std::chrono::steady_clock::now();
    if (now - lastCheck > std::chrono::milliseconds(20)) {
      if (checked()) return;
      lastCheck = now;
    }
  }
}

}  // namespace hoccl
