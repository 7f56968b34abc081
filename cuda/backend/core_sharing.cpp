#include "backend/core_sharing.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <mutex>
#include <string>

#include "backend/thread_scan.h"

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

std::chrono::nanoseconds cpuTime(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// The scan's own cost: on a busy machine its wall time also counts the time it waited for a core.
std::chrono::nanoseconds threadCpuTime() { return cpuTime(CLOCK_THREAD_CPUTIME_ID); }

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

bool LoadSampler::due(std::chrono::steady_clock::time_point now) const {
  return !sampled_ || now - lastSample_ >= interval_;
}

void LoadSampler::note(std::chrono::steady_clock::time_point now, bool over) {
  constexpr int64_t kWindow = 5;
  const int64_t intervals = sampled_ ? std::clamp<int64_t>((now - lastSample_) / interval_, 1, kWindow) : 1;
  history_ = (intervals >= kWindow ? 0u : history_ << (intervals - 1)) & 0x1f;  // unsampled intervals
  history_ = ((history_ << 1) | (over ? 1u : 0u)) & 0x1f;
  lastSample_ = now;
  sampled_ = true;
}

bool LoadSampler::overloaded() const { return __builtin_popcount(history_) >= 2; }

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

const char* coreSharingName(CoreSharing sharing) {
  switch (sharing) {
    case CoreSharing::None:
      return "none";
    case CoreSharing::AmongRanks:
      return "among_ranks";
    case CoreSharing::WithOtherWork:
      return "with_other_work";
  }
  return "?";
}

namespace {
using std::chrono::milliseconds;
constexpr milliseconds kLookAgainAfter{1};
constexpr milliseconds kPromptedScanGap{2};  // after the last scan
constexpr milliseconds kQuietBeforeStop{5};  // over a clock tick (1-4 ms), which lags a thread's CPU time
constexpr milliseconds kMutedAfterFalsePrompt{10};
constexpr milliseconds kScanInterval{50};
constexpr milliseconds kScanIntervalMax{250};
}  // namespace

void ComputeSampler::noteOthersCpu(Clock::time_point now, std::chrono::nanoseconds cpu,
                                   std::chrono::nanoseconds window) {
  const bool othersRun = cpu * 20 > window;  // over 5 % of a core: more than torch's housekeeping
  if (othersRun) othersLastBusy_ = now;
  const bool mayHaveChanged = computing_ ? now - othersLastBusy_ >= kQuietBeforeStop : othersRun;
  if (!mayHaveChanged || now < promptsFrom_) return;
  const auto soonest = std::max(now, lastScan_ + kPromptedScanGap);
  if (soonest < next_) {
    next_ = soonest;
    prompted_ = true;
  }
}

// The two mistakes differ: a yield beside compute costs a compute thread's slice (world 4 on 2
// cores, 4 KiB all_reduce: 1.7-9.4 ms yielding against 186-621 us sleeping), a sleep where a peer
// rank would have taken the yield ~0.1 ms. So compute counts from its first sighting, looked at
// again a millisecond later (a thread that was finishing as the op started is gone by then), and
// stops counting once two scans a millisecond apart found nothing runnable.
void ComputeSampler::note(Clock::time_point now, int others, std::chrono::nanoseconds cost) {
  lastScan_ = now;
  readable_ = others >= 0;
  const bool seen = others > 0, lookedAgain = lookAgain_;
  lookAgain_ = false;
  if (readable_ && seen != computing_ && (seen || !lookedAgain)) {
    if (seen) othersLastBusy_ = now;
    computing_ = computing_ || seen;
    lookAgain_ = true;
    prompted_ = false;
    next_ = now + kLookAgainAfter;
    return;
  }
  if (readable_ && seen != computing_) {
    computing_ = false;
  } else if (prompted_) {
    promptsFrom_ = now + kMutedAfterFalsePrompt;
  }
  prompted_ = false;
  next_ = now + std::clamp<std::chrono::nanoseconds>(cost * 400, kScanInterval, kScanIntervalMax);
}

// Load past the CPUs and the ranks makes a yield costly only where the scheduler does not group
// tasks: elsewhere it is other sessions' or containers' work, which a yield does not feed (world
// 4 on 2 cores beside other sessions' builds, 4 KiB all_reduce: 129-164 us yielding against
// 180-186 us sleeping at once; beside compute in the same session, 1.7-9.4 ms yielding against
// 186-621 us sleeping).
CoreSharing decideCoreSharing(const CoreSharingSignals& s) {
  if (!s.loaded && s.ranks <= s.cpus) return CoreSharing::None;
  if (s.ownCompute || (s.loaded && !s.tasksGrouped)) return CoreSharing::WithOtherWork;
  return CoreSharing::AmongRanks;
}

// Each op thread reads over its own window: ops may run on the caller or on the worker.
static void noteOthersCpu(ComputeSampler& sampler, std::chrono::steady_clock::time_point now) {
  struct Reading {
    std::chrono::steady_clock::time_point at{};
    std::chrono::nanoseconds process{0}, self{0};
  };
  thread_local Reading last;
  if (now - last.at < std::chrono::milliseconds(1)) return;
  const Reading r{now, cpuTime(CLOCK_PROCESS_CPUTIME_ID), threadCpuTime()};
  if (last.at != std::chrono::steady_clock::time_point{})
    sampler.noteOthersCpu(now, (r.process - last.process) - (r.self - last.self), now - last.at);
  last = r;
}

CoreSharing coreSharingNow(WaitPolicy policy) {
  if (policy == WaitPolicy::Busy) return CoreSharing::WithOtherWork;
  if (policy == WaitPolicy::Idle) return CoreSharing::None;
  static std::mutex mutex;
  static LoadSampler load;
  static ComputeSampler compute;
  CoreSharingSignals s;
  s.ranks = jobRanksOnHost();
  s.cpus = cpusAllowed();
  s.tasksGrouped = tasksGrouped();
  std::lock_guard<std::mutex> lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  if (load.due(now)) load.note(now, runnableThreadsNow() > std::max(onlineCpus(), s.ranks));
  s.loaded = load.overloaded();
  if (decideCoreSharing(s) == CoreSharing::None) return CoreSharing::None;  // whatever computes: no scan
  noteOthersCpu(compute, now);
  if (compute.due(now)) {
    const auto cpuBefore = threadCpuTime();
    const int others = otherRunnableThreadsInProcess(1);
    compute.note(now, others, threadCpuTime() - cpuBefore);
  }
  s.ownCompute = compute.readable() ? compute.computing() : s.loaded;
  return decideCoreSharing(s);
}

}  // namespace hoccl
