#include "backend/core_sharing.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace hoccl {
namespace {

std::atomic<int> ranksFromGroups{0};

// Read once: a syscall per op would cost more than the decision saves on small ops.
int cpusAllowed() {
  static const int cpus = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
    return std::max(1, CPU_COUNT(&set));
  }();
  return cpus;
}

int onlineCpus() {
  static const int cpus = [] {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? static_cast<int>(n) : 1;
  }();
  return cpus;
}

int localWorldSizeFromEnv() {
  static const int ranks = [] {
    const char* v = std::getenv("LOCAL_WORLD_SIZE");
    if (!v || !*v) return 0;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    return (end && *end == '\0' && n > 0 && n < (1 << 20)) ? static_cast<int>(n) : 0;
  }();
  return ranks;
}

// "0.52 0.58 0.59 3/467 12345": the fourth field's numerator.
int parseRunnable(const char* text) {
  const char* p = text;
  for (int field = 0; field < 3; ++field) {
    while (*p && *p != ' ') ++p;
    while (*p == ' ') ++p;
  }
  if (*p < '0' || *p > '9') return -1;
  return static_cast<int>(std::strtol(p, nullptr, 10));
}

}  // namespace

void noteJobRanksOnHost(int ranks) {
  int seen = ranksFromGroups.load();
  while (ranks > seen && !ranksFromGroups.compare_exchange_weak(seen, ranks)) {
  }
}

int jobRanksOnHost() { return std::max({1, ranksFromGroups.load(), localWorldSizeFromEnv()}); }

int runnableThreadsNow() {
  // Opened once: a seq_file regenerates on every read from offset 0, so one pread per sample.
  static int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  return parseRunnable(buf);
}

LoadSampler::LoadSampler(std::chrono::milliseconds interval) : interval_(interval) {}

bool LoadSampler::overloaded(std::chrono::steady_clock::time_point now, int capacity) {
  if (samples_ == 0 || now - lastSample_ >= interval_) {
    lastSample_ = now;
    history_ = ((history_ << 1) | (runnableThreadsNow() > capacity ? 1u : 0u)) & 0x1f;
    samples_ = std::min(samples_ + 1, 5);
  }
  return __builtin_popcount(history_) >= 2;
}

// Other work: more runnable threads than the machine's CPUs and than the job's ranks here (ranks
// that spin or run their part of an op are runnable too, and must not count as load).
CoreSharing coreSharingNow(WaitPolicy policy) {
  if (policy == WaitPolicy::Busy) return CoreSharing::WithOtherWork;
  if (policy == WaitPolicy::Idle) return CoreSharing::None;
  const int ranks = jobRanksOnHost();
  static std::mutex mutex;
  static LoadSampler sampler;
  bool loaded;
  {
    std::lock_guard<std::mutex> lock(mutex);
    loaded = sampler.overloaded(std::chrono::steady_clock::now(), std::max(onlineCpus(), ranks));
  }
  if (loaded) return CoreSharing::WithOtherWork;
  return ranks > cpusAllowed() ? CoreSharing::AmongRanks : CoreSharing::None;
}

}  // namespace hoccl
