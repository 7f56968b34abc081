#include "backend/core_sharing.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

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

static int64_t clockNs(clockid_t clock) {
  timespec ts;
  if (clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void OwnComputeMeter::registerThisThread() {
  clockid_t clock;
  if (pthread_getcpuclockid(pthread_self(), &clock) != 0) return;
  opThreads_.push_back({clock, clockNs(clock)});
  lastProcessNs_ = -1;  // the new thread's time so far belongs to no window: start a fresh one
}

int OwnComputeMeter::permilleSinceLastCall(std::chrono::steady_clock::time_point now) {
  const int64_t processNs = clockNs(CLOCK_PROCESS_CPUTIME_ID);
  int64_t opNs = 0;
  bool threadGone = false;
  for (size_t i = 0; i < opThreads_.size();) {
    const int64_t ns = clockNs(opThreads_[i].clock);
    if (ns < 0) {  // exited: its time stays in the process's total, so this window is not told
      opThreads_[i] = opThreads_.back();
      opThreads_.pop_back();
      threadGone = true;
      continue;
    }
    opNs += ns - opThreads_[i].lastNs;
    opThreads_[i].lastNs = ns;
    ++i;
  }
  const int64_t wallNs = std::chrono::duration_cast<std::chrono::nanoseconds>(now - lastWall_).count();
  const bool first = lastProcessNs_ < 0 || processNs < 0;
  const int64_t otherNs = first ? 0 : processNs - lastProcessNs_ - opNs;
  lastProcessNs_ = processNs;
  lastWall_ = now;
  if (first || threadGone || wallNs <= 0) return -1;
  return static_cast<int>(std::max<int64_t>(0, otherNs) * 1000 / wallNs);
}

bool tasksGrouped() {
  static const bool grouped = [] {
    std::ifstream autogroup("/proc/sys/kernel/sched_autogroup_enabled");
    int enabled = 0;
    if (autogroup >> enabled && enabled != 0) return true;
    // cgroup v1 "4:cpu,cpuacct:/path" or v2 "0::/path": a path other than the root groups tasks.
    std::ifstream cgroups("/proc/self/cgroup");
    std::string line;
    while (std::getline(cgroups, line)) {
      const size_t a = line.find(':'), b = line.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
      const bool cpu = controllers == ",," || controllers.find(",cpu,") != std::string::npos;
      if (cpu && line.substr(b + 1) != "/") return true;
    }
    return false;
  }();
  return grouped;
}

namespace {
// Share of a core the job's own compute (outside op threads) must take in a window to count:
// a GEMM thread beside each of 4 ranks on 2 cores gets ~250-500; c10d's own threads, ~0.
constexpr int kComputeMinPermille = 200;
}  // namespace

// Other work that takes a yield's core: the job's own compute beside the ranks (sampled every 50
// ms like the load, 2 of the last 5 windows). The machine's runnable threads beyond its CPUs and
// the job's ranks say the cores are shared; they say yields are costly only where the scheduler
// does not group tasks (tasksGrouped): elsewhere that load is in other sessions or containers,
// which a yield does not feed (world 4 on 2 cores beside other sessions' builds, 4 KiB all_reduce:
// 129-164 us yielding against 180-186 us sleeping at once; beside compute in the same session,
// 1.7-9.4 ms yielding against 186-621 us sleeping).
CoreSharing coreSharingNow(WaitPolicy policy) {
  if (policy == WaitPolicy::Busy) return CoreSharing::WithOtherWork;
  if (policy == WaitPolicy::Idle) return CoreSharing::None;
  const int ranks = jobRanksOnHost();
  static std::mutex mutex;
  static LoadSampler sampler;
  static OwnComputeMeter meter;
  static std::chrono::steady_clock::time_point lastComputeSample{};
  static uint32_t computeHistory = 0;
  thread_local bool registered = false;
  bool loaded, computing;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto now = std::chrono::steady_clock::now();
    if (!registered) {
      meter.registerThisThread();
      registered = true;
    }
    if (now - lastComputeSample >= std::chrono::milliseconds(50)) {
      lastComputeSample = now;
      const int permille = meter.permilleSinceLastCall(now);
      if (permille >= 0) computeHistory = ((computeHistory << 1) | (permille >= kComputeMinPermille ? 1u : 0u)) & 0x1f;
    }
    computing = __builtin_popcount(computeHistory) >= 2;
    loaded = sampler.overloaded(now, std::max(onlineCpus(), ranks));
  }
  if (computing) return CoreSharing::WithOtherWork;
  if (loaded) return tasksGrouped() ? CoreSharing::AmongRanks : CoreSharing::WithOtherWork;
  return ranks > cpusAllowed() ? CoreSharing::AmongRanks : CoreSharing::None;
}

}  // namespace hoccl
