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
// and, where tasks are grouped, only says cores are shared (AmongRanks: yields stay on).
#pragma once
#include <chrono>
#include <cstdint>
#include <ctime>
#include <vector>

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
// of the last five samples saw more runnable threads than `capacity` (one stray kernel thread
// does not flip it, a lasting load does within ~100 ms).
class LoadSampler {
 public:
  explicit LoadSampler(std::chrono::milliseconds interval = std::chrono::milliseconds(50));
  bool overloaded(std::chrono::steady_clock::time_point now, int capacity);

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point lastSample_{};
  uint32_t history_ = 0;  // bit i: sample i back was over the CPUs
  int samples_ = 0;
};

// CPU time this process spent outside the threads that run hoccl ops, as a share of one core
// (1000: one core's worth) since the previous call: the model's compute threads, DDP's backward,
// torch's intra-op pool. Op threads (the caller of a synchronous op, the worker) are excluded
// whole: their waits are the ranks' own, and their work between ops is serialized with the op.
// The first call from a thread registers it as an op thread. -1 on the first call.
class OwnComputeMeter {
 public:
  int permilleSinceLastCall(std::chrono::steady_clock::time_point now);
  void registerThisThread();

 private:
  struct OpThread {
    clockid_t clock;
    int64_t lastNs;
  };
  std::vector<OpThread> opThreads_;
  int64_t lastProcessNs_ = -1;
  std::chrono::steady_clock::time_point lastWall_{};
};

// Whether the scheduler groups tasks (autogroup per session, or a cpu cgroup other than the
// root): then another session's load does not receive this process's yields.
bool tasksGrouped();

// This process's view, for the op it is about to run: the policy when forced (Busy: other
// work), else ranks per core and the machine's load. Thread-safe.
CoreSharing coreSharingNow(WaitPolicy policy);

}  // namespace hoccl
