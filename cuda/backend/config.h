// The settings a process group runs with, read once from the configuration table
// (common/config.h) when the group is created.
#pragma once
#include <cstdint>
#include <string>

#include "backend/core_sharing.h"
#include "transport/shm/shm_group.h"

namespace hoccl {

enum class AllToAllAlgo { Direct, Pairwise, VarioPath };

struct HocclConfig {
  ShmConfig shm;
  int64_t oneShotMaxBytes = 64 << 10;
  int64_t crossMemoryMinBytes = 256 << 10;
  // Staged plans move data in rounds of at most this many bytes per slot: rounds that stay in
  // cache, at the price of more barriers. 0: all_reduce 128 KiB (the whole slot while cores are
  // shared: each barrier then waits for the last rank to be scheduled), other ops the whole slot.
  int64_t stagedRoundBytes = 0;
  // all_reduce stages below this (and crossMemoryMinBytes): two direct reads per byte with their
  // page pinning lose to copies through cache-sized rounds until the data outgrows the cache.
  int64_t allReduceCrossMemoryMinBytes = 4 << 20;
  int64_t allToAllCrossMemoryMinBytes = 0;  // all_to_all reads peers directly from this per-rank size
  int64_t allReduceDirectReadMaxBytes = 64 << 20;  // all_reduce: direct reads below bytes x world
  int64_t inlineMaxBytes = 64 << 10;  // run smaller collectives on the caller's thread when idle
  int64_t callerSpinMicros = 0;       // barrier spin of ops run on a caller's thread that waits for them
  int64_t sharedCallerSpinMicros = 0;  // the same while cores are shared (core_sharing.h)
  int64_t sharedYieldMicros = 0;       // yield window before a futex sleep while other work shares the cores
  int64_t sharedSliceMicros = 100;     // scheduler time slice a waiter asks for while it sleeps on shared cores (0: default)
  WaitPolicy waitPolicy = WaitPolicy::Auto;
  int64_t streamingCopyMinBytes = 4 << 20;  // ops with outputs this large copy into them bypassing the cache
  int64_t hugePageMinBytes = 4 << 20;  // reused peer-read buffers from this size go on huge pages (0: off)
  int64_t alltoallPlanCache = 8;       // VarioPath plans kept for repeated split matrices (0: off)
  bool cudaViaHostOnly = false;  // HOCCL_CUDA_TRANSPORT=host
  int debug = 0;  // 0 off, 1 INFO, 2 TRACE
  AllToAllAlgo alltoall = AllToAllAlgo::Direct;
  static HocclConfig fromEnv(int world);
  // fromEnv for a group being created: a bad variable fails with an error naming the rank.
  static HocclConfig forGroupCreation(int rank, int world);
};

}  // namespace hoccl
