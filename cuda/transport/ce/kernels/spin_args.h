// The one argument of hoccl_spin_until_flag, shared by spin.cu (device side), ce_spin.cpp (the
// cuLaunchKernel side) and the CPU driver model. Plain C layout: every compiler must agree on it.
#pragma once

// The kernel's __launch_bounds__: the largest block ce_spin.cpp launches.
#define HOCCL_SPIN_MAX_THREADS 1024

// Per-block state words the kernel writes (host-mapped, so the host sees them while it runs).
enum HocclSpinState { HocclSpinNotStarted = 0, HocclSpinRunning = 1, HocclSpinReleased = 2,
                      HocclSpinTimedOut = 3 };

struct HocclSpinArgs {
  const unsigned* release;   // device address of a host-mapped word; nonzero: every block ends
  unsigned* state;           // device address of host-mapped words, one per block (HocclSpinState)
  unsigned long long limitNs; // each block ends after this long even if never released
  unsigned pollNs;           // sleep between reads of `release` (keeps PCIe reads rare)
};
