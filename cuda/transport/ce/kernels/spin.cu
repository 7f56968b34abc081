// A kernel whose only job is to occupy SMs: the sm_free check (cuda/transport/ce/ce_sm_check.cpp)
// launches enough blocks to fill every SM's resident threads, then issues the transport's copies
// on another stream. A copy that completes while these blocks hold the SMs ran on a copy engine.
//
// Thread 0 of each block says it is resident, then polls a host-mapped release word; the other
// threads wait at the barrier, which keeps their thread slots taken. The wait is bounded by the
// global nanosecond timer, so a lost host (crash, deadline) can never leave the GPU spinning.
#include "spin_args.h"

namespace {

__device__ __forceinline__ unsigned long long nowNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));  // PTX: 64-bit global nanosecond timer
  return t;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(HOCCL_SPIN_MAX_THREADS) hoccl_spin_until_flag(HocclSpinArgs a) {
  if (threadIdx.x == 0) {
    volatile unsigned* state = a.state + blockIdx.x;
    const volatile unsigned* release = a.release;
    *state = HocclSpinRunning;
    __threadfence_system();  // the host must see "running" while we spin, not after
    const unsigned long long start = nowNs();
    unsigned result = HocclSpinReleased;
    while (*release == 0) {
      if (nowNs() - start > a.limitNs) {
        result = HocclSpinTimedOut;
        break;
      }
      __nanosleep(a.pollNs);
    }
    *state = result;
    __threadfence_system();
  }
  __syncthreads();
}
