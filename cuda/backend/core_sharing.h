// Whether this host's cores are shared: by more ranks of the job than the CPUs a rank may run on,
// or by more runnable threads than the machine has CPUs (the model's compute, other processes).
// While they are, a waiter that spins holds the core a descheduled peer needs, and every barrier
// of an op costs a wake-up of the slowest rank: waits then stop spinning and all_reduce stages in
// one round (backend/config.h). Decided per process from the whole job and the machine, never
// from one group's size: the 2-rank subgroups of a 4-rank job on 2 cores share cores too.
//
// Whether a waiter may yield before it sleeps depends on who would get the core. sched_yield
// only reorders the yielder among the tasks of its own scheduling group (its autogroup, i.e. its
// session, or its cpu cgroup): a yield hands the core to a peer rank or to the job's own compute
// (a whole time slice), never to another session's or container's processes, which get their
// fair share whatever the job does. So only the job's own compute makes yields costly
// (WithOtherWork); the machine's runnable-thread count (/proc/loadavg) cannot tell the two apart
// and, where tasks are grouped, only says cores are shared (AmongRanks: yields stay on). Other
// processes of the job's own session or container (data-loader workers, a shell's `yes`) do take
// yields: the waits' YieldGate (transport/shm/futex_wait.h) stops yielding once one is lost.
#pragma once
#include <chrono>
#include <cstdint>

namespace hoccl {

enum class WaitPolicy { Auto, Busy, Idle };  // HOCCL_WAIT_POLICY

enum class CoreSharing {
  None,           // every rank can have a core of its own, nothing else competes
  AmongRanks,     // more ranks of the job on this host than CPUs, nothing else competes
  WithOtherWork,  // the job's own compute runs beside the ranks (or, where the scheduler does not
                  // group tasks, more runnable threads than CPUs and ranks)
};

// Ranks of this job on this host, the largest any source says: LOCAL_WORLD_SIZE (torchrun), and
// every hoccl group's own host table (the default group, created first, spans the whole host).
void noteJobRanksOnHost(int ranks);
int jobRanksOnHost();

// Runnable threads on the machine now, from /proc/loadavg (the reader included); -1 if unreadable.
int runnableThreadsNow();

// The machine-load part of the decision, sampled at most every `interval` (a read of
// /proc/loadavg costs a few microseconds, an op as little as a few): loaded while at least two
// of the last five intervals' samples saw more runnable threads than the capacity (one stray
// kernel thread does not flip it, a lasting load does within ~100 ms). Samples come with ops
// only; intervals that passed without one count as not loaded, so the history of a burst of ops
// before a pause (the model's compute between them) ages out instead of deciding the next burst,
// and one stray sample after a pause (another backend's threads finishing) does not flip it. The
// job's own compute beside a rank is seen at once by ComputeSampler, not by this.
class LoadSampler {
 public:
  explicit LoadSampler(std::chrono::milliseconds interval = std::chrono::milliseconds(50));
  bool due(std::chrono::steady_clock::time_point now) const;
  void note(std::chrono::steady_clock::time_point now, bool over);
  bool overloaded() const;

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point lastSample_{};
  uint32_t history_ = 0;  // bit i: sample i back was over the CPUs
  bool sampled_ = false;
};

// Whether the job's own compute runs beside this process's ops, from snapshots of its runnable
// threads (otherRunnableThreadsInProcess, backend/thread_scan.h) rather than CPU time over a
// window: another backend's turn that just ended, or compute that paused, does not hold it for
// the next ops. Compute counts from its first sighting and stops counting once two scans a
// millisecond apart found none (note() says why).
//
// A scan costs ~3 us a thread on a VM and a small op a few us, so scans come when the CPU time
// of the process's other threads (a clock read, ~1 us, at most every millisecond) says the
// answer may have changed: their CPU while no compute was seen, or none for 5 ms while it was.
// A scan so prompted that finds nothing new mutes the prompts for 10 ms (another backend's turn,
// torch's own threads); without prompts, a scan every 50 ms, or 400 times its cost where threads
// are many (under 0.25 % of the time).
class ComputeSampler {
 public:
  using Clock = std::chrono::steady_clock;
  bool due(Clock::time_point now) const { return now >= next_; }
  // CPU time the process's threads other than the caller took over the `window` up to now.
  void noteOthersCpu(Clock::time_point now, std::chrono::nanoseconds cpu, std::chrono::nanoseconds window);
  // `others`: the scan's count (-1: unreadable); `cost`: the CPU time the scan took.
  void note(Clock::time_point now, int others, std::chrono::nanoseconds cost);
  bool computing() const { return computing_; }
  bool readable() const { return readable_; }  // false while scans fail: nothing known

 private:
  Clock::time_point next_{};
  Clock::time_point lastScan_{};
  Clock::time_point othersLastBusy_{};  // when the other threads' CPU last said they run
  Clock::time_point promptsFrom_{};     // prompts before this are muted
  bool prompted_ = false;               // next_ was brought forward by the CPU time
  bool computing_ = false;
  bool readable_ = true;
  bool lookAgain_ = false;  // the last scan changed computing_ or doubted it: the next one settles it
};

// "none", "among_ranks", "with_other_work".
const char* coreSharingName(CoreSharing sharing);

// What coreSharingNow decides from, each sampled by it.
struct CoreSharingSignals {
  int ranks = 1;              // the job's ranks on this host (jobRanksOnHost)
  int cpus = 1;               // CPUs a rank may run on
  bool loaded = false;        // the machine's runnable threads past its CPUs and the ranks (LoadSampler)
  bool ownCompute = false;    // another thread of this process runnable at op start (ComputeSampler)
  bool tasksGrouped = false;  // tasksGrouped()
};

// Shared cores need more ranks than CPUs or a loaded machine; whether the job's own compute
// shares them (no yields) needs its threads or, where the scheduler does not group tasks, the
// load. Compute beside ranks that each have a core of their own shares nothing: they spin.
CoreSharing decideCoreSharing(const CoreSharingSignals& s);

// Whether the scheduler groups tasks (autogroup per session, or a cpu cgroup other than the
// root): then another session's load does not receive this process's yields.
bool tasksGrouped();

// This process's view, for the op it is about to run: the policy when forced (Busy: other
// work), else decideCoreSharing from ranks per core, the machine's load and, while those say
// cores are shared, this process's compute threads (the scan costs nothing otherwise). A process
// whose threads cannot be scanned takes the load for its compute. Thread-safe.
CoreSharing coreSharingNow(WaitPolicy policy);

}  // namespace hoccl
