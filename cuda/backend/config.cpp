#include "backend/config.h"

#include <algorithm>

#include "common/config.h"

namespace hoccl {
namespace {

WaitPolicy waitPolicyFromEnv() {
  std::string v = config::text("HOCCL_WAIT_POLICY");
  return v == "busy" ? WaitPolicy::Busy : v == "idle" ? WaitPolicy::Idle : WaitPolicy::Auto;
}

// A spin the user set holds whether or not cores are shared; the automatic one stops while they
// are (a spinning waiter holds the core a descheduled peer needs).
int64_t spinWhenShared(const char* name) { return config::isSet(name) ? config::integer(name, 0, 0) : 0; }

}  // namespace

HocclConfig HocclConfig::fromEnv(int world) {
  config::validateAll();
  HocclConfig c;
  c.shm.slotBytes = static_cast<size_t>(config::bytes("HOCCL_SHM_SLOT_BYTES", 0, 4096));
  // Rings are per ordered pair, so shrink them as the group grows.
  int64_t ringAuto = std::max<int64_t>(64 << 10, std::min<int64_t>(1 << 20, (64LL << 20) / (world * world)));
  c.shm.ringBytes = static_cast<size_t>(config::bytes("HOCCL_SHM_RING_BYTES", ringAuto, 4096));
  c.oneShotMaxBytes = config::bytes("HOCCL_ALLREDUCE_ONESHOT_BYTES");
  c.crossMemoryMinBytes = config::bytes("HOCCL_CMA_MIN_BYTES");
  c.stagedRoundBytes = config::bytes("HOCCL_STAGED_ROUND_BYTES", 0, 4096);
  c.allReduceCrossMemoryMinBytes = config::bytes(
      "HOCCL_ALLREDUCE_CMA_MIN_BYTES", config::isSet("HOCCL_CMA_MIN_BYTES") ? c.crossMemoryMinBytes : 4 << 20);
  // all_to_all pays process_vm_readv's fixed cost once per peer block: direct reads win once
  // each block is 16 KiB (measured at worlds 2 and 4, docs/mpi_comparison.md).
  c.allToAllCrossMemoryMinBytes = config::bytes(
      "HOCCL_ALLTOALL_CMA_MIN_BYTES", config::isSet("HOCCL_CMA_MIN_BYTES") ? c.crossMemoryMinBytes : (16LL << 10) * world);
  std::string cma = config::text("HOCCL_SHM_CMA");
  c.shm.crossMemory = cma == "auto" ? -1 : (cma == "1" || cma == "on") ? 1 : 0;
  // Spinning pays only while every rank has a core: an oversubscribed peer needs ours to run.
  // Whether it has one is decided before each op from the whole job and the machine
  // (core_sharing.h), not from this group's size.
  c.waitPolicy = waitPolicyFromEnv();
  c.shm.spinMicros = config::integer("HOCCL_SPIN_US", 30, 0);
  c.shm.sharedSpinMicros = spinWhenShared("HOCCL_SPIN_US");
  // A caller blocked on its op leaves its thread nothing else to do, and a sleeping waiter costs
  // a futex wake-up, which on a virtual machine whose idle vCPUs halt can take longer than the
  // op. Short spins then lock two ranks into taking turns to sleep at every barrier (1 MiB
  // all_to_all: ~700 instead of ~120 us per op on the 2-core VM, docs/mpi_comparison.md).
  c.callerSpinMicros = config::integer("HOCCL_CALLER_SPIN_US", 2000, 0);
  c.sharedCallerSpinMicros = spinWhenShared("HOCCL_CALLER_SPIN_US");
  c.sharedYieldMicros = config::integer("HOCCL_SHARED_YIELD_US", 0, 0);
  c.sharedSliceMicros = config::integer("HOCCL_SHARED_SLICE_US", 100, 0);
  c.inlineMaxBytes = config::bytes("HOCCL_INLINE_BYTES");
  c.streamingCopyMinBytes = config::bytes("HOCCL_STREAMING_COPY_BYTES");
  c.hugePageMinBytes = config::bytes("HOCCL_HUGEPAGE_MIN_BYTES");
  // Cross-memory reads of reused buffers on huge pages are faster (docs/benchmarks.md), which
  // moves the point where staging beats all_reduce's two direct reads per byte further out.
  c.allReduceDirectReadMaxBytes =
      config::bytes("HOCCL_ALLREDUCE_CMA_MAX_BYTES", c.hugePageMinBytes > 0 ? 256 << 20 : 64 << 20);
  c.alltoallPlanCache = config::integer("HOCCL_ALLTOALL_PLAN_CACHE", 0, 0);
  c.cudaViaHostOnly = config::text("HOCCL_CUDA_TRANSPORT") == "host";
  std::string dbg = config::text("HOCCL_DEBUG");
  c.debug = dbg == "TRACE" ? 2 : (dbg == "INFO" ? 1 : 0);
  std::string algo = config::text("HOCCL_ALLTOALL_ALGO");
  c.alltoall = algo == "direct" ? AllToAllAlgo::Direct
               : algo == "pairwise" ? AllToAllAlgo::Pairwise : AllToAllAlgo::VarioPath;
  return c;
}

HocclConfig HocclConfig::forGroupCreation(int rank, int world) {
  try {
    return fromEnv(world);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("hoccl process group creation on rank " + std::to_string(rank) + ": " + e.what());
  }
}

}  // namespace hoccl
