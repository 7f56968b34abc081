// Cross-process waiting on 32-bit words in shared memory: spin briefly, yield, then sleep on a
// futex. Tests run 4 ranks on 2 cores, so a waiter must never burn a core for long while ranks
// outnumber the CPUs.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

namespace hoccl {

// Wakes every process sleeping on `word` (shared futex).
void futexWakeAll(std::atomic<uint32_t>* word);

// Sleeps while *word == expected, at most `timeout`. Spurious returns are fine.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);

// Sequence numbers wrap: "a has reached b" in modular arithmetic.
inline bool seqReached(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

// Blocks until ready() is true. `word`/`waiters` are what the producer bumps/wakes.
// `check` runs every few milliseconds while sleeping: it throws on timeout, abort or a dead peer.
// `spin`: how long to busy-wait before the first yield. Worth it only while every rank has a
// core of its own: then the peer is running and arrives within microseconds, while a yield to
// any other runnable process costs its whole time slice.
void waitUntil(const std::function<bool()>& ready, std::atomic<uint32_t>* word,
               std::atomic<uint32_t>* waiters, const std::function<void()>& check,
               std::chrono::microseconds spin = std::chrono::microseconds(0));

// Process-wide: whether this host's cores are shared (backend/core_sharing.h decides, before
// each op), and how long a waiter then yields before it sleeps on the futex. Callers stop
// spinning while cores are shared; the yield window is a millisecond when only ranks share the
// cores (a yield hands the core to a peer rank) and shorter when other work shares them (a yield
// to a compute thread costs that thread's whole time slice; a sleeper is woken on arrival).
// `sleeperSlice` > 0: a waiter that goes to sleep asks for time slices that short while it
// sleeps (ShortSlices), so that its peer's wake-up preempts whatever holds its core; it gets its
// own slice back once awake, so the op's copies are not cut into short slices themselves.
void setCoresShared(bool shared, std::chrono::microseconds yieldWindow, std::chrono::microseconds sleeperSlice);
bool coresShared();

// While alive on a thread, and with `slice` > 0: the thread asks the scheduler for time slices of
// `slice` (sched_setattr's sched_runtime for SCHED_OTHER, Linux 6.12 and later). A task woken
// with a shorter slice than the one running on its core preempts it (EEVDF), so a rank woken by
// its peer's arrival runs at once instead of after a compute thread's slice. The thread's own
// attributes come back on exit; where the kernel refuses (older kernels, real-time policies),
// nothing changes.
class ShortSlices {
 public:
  explicit ShortSlices(std::chrono::microseconds slice);
  ~ShortSlices();
  ShortSlices(const ShortSlices&) = delete;
  ShortSlices& operator=(const ShortSlices&) = delete;

 private:
  bool changed_ = false;
  uint64_t savedSliceNs_ = 0;
};

// While alive, every wait on this thread spins for at least `spin` before yielding. For a thread
// whose caller is blocked until the op completes: it has nothing else to run, and the futex
// wake-up it would otherwise sleep through can outlast the wait (halted vCPUs of a VM).
class SpinAtLeast {
 public:
  explicit SpinAtLeast(std::chrono::microseconds spin);
  ~SpinAtLeast();
  SpinAtLeast(const SpinAtLeast&) = delete;
  SpinAtLeast& operator=(const SpinAtLeast&) = delete;

 private:
  std::chrono::microseconds saved_;
};

// Whether a waiter may yield its core before it sleeps. sched_yield feeds whatever shares the
// yielder's scheduling group (its session's autogroup or its cpu cgroup): peer ranks, but also
// any other process there, such as the job's data-loader workers or a `yes > /dev/null` started
// from the job's shell, which core_sharing.h's load figure cannot tell from other sessions' work.
// A yield that kept its thread off the core for kLostYield while the awaited word did not move
// fed such a process a whole time slice (world 2 on 2 cores beside two CPU-bound processes of the
// same session, 4 KiB all_reduce: ~2 ms an op with yields, 60 us sleeping at once): the gate then
// closes for kClosedFor, for every waiter of the process; a peer rank taking the core either
// arrives (the word moves) or returns it within the op's own work. Reopening costs at most one
// lost slice a second. Thread-safe.
class YieldGate {
 public:
  static constexpr std::chrono::microseconds kLostYield{500};
  static constexpr std::chrono::seconds kClosedFor{1};
  bool open(std::chrono::steady_clock::time_point now) const;
  // A yield that ended at `now` after `took`; `progressed`: the awaited word moved meanwhile.
  void noteYield(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds took, bool progressed);
  uint64_t lostYields() const { return lost_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> closedUntil_{INT64_MIN};  // steady_clock ticks
  std::atomic<uint64_t> lost_{0};
};

// The gate every wait of this process consults.
extern YieldGate processYieldGate;

// Producer side: publish a new value and wake sleepers only when some exist (saves a syscall).
inline void publishAndWake(std::atomic<uint32_t>* word, uint32_t value,
                           std::atomic<uint32_t>* waiters) {
  word->store(value, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) futexWakeAll(word);
}

}  // namespace hoccl
