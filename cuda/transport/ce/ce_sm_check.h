// The sm_free check: do the cuda-ce transport's copies run without SMs?
//
// It fills every SM with the spin kernel (ce_spin.h) on one stream, waits (host deadline) until
// every block reports itself resident, then issues each kind of copy the transport makes, through
// the transport's own copy functions (ce_copy.h), on streams of their own, and polls an event
// behind each copy with a host deadline while the spinner still holds the SMs. A copy that
// completes then ran on a copy engine; one that completes only after the flag is released needed
// SMs. Every driver call is checked and reported by its CUresult name; every wait has a deadline
// (and the kernel a time limit of its own), so the check cannot hang.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "transport/ce/cuda_driver.h"

namespace hoccl {

struct SmCheckOptions {
  size_t bytes = 32u << 20;     // per copy
  double startDeadlineS = 5.0;  // for every spin block to become resident
  double copyDeadlineS = 1.0;   // per copy, while the SMs are held
  double drainDeadlineS = 5.0;  // after the release, for every copy and the spinner to finish
};

struct SmCheckRow {
  std::string direction;  // d2h, h2d (host path); d2d (p2p path, as issued); d2d_memcpy, d2d_batch
  std::string usedBy;     // the path that issues it this way: "host", "p2p" or "" (for comparison)
  std::string call;       // the driver call that carried it
  size_t bytes = 0;
  bool completed = false;               // finished at all (before or after the release)
  bool completedWhileSmsFull = false;   // finished while every spin block was still resident
  double microseconds = -1;             // issue to observed completion (host clock); -1: never
  std::string error;                    // "" or the failing call with its CUresult name
};

struct SmCheckReport {
  int device = 0;
  int driverVersion = 0;
  int sms = 0;
  int threadsPerBlock = 0;
  int blocksPerSm = 0;
  int maxThreadsPerSm = 0;
  std::string occupancySource;
  int blocks = 0;
  int blocksResident = 0;   // blocks that reported running at once before the copies
  int blocksTimedOut = 0;   // blocks that hit the kernel's own time limit (the host was too slow)
  bool smsFull = false;     // every block resident and every thread slot taken
  bool peerAccess = false;  // another visible GPU with peer access (auto would take p2p to it)
  std::vector<SmCheckRow> rows;
  std::vector<std::string> errors;
};

// Never throws for CUDA failures: they land in `errors` / the rows.
SmCheckReport runSmCheck(int device, const SmCheckOptions& options);

}  // namespace hoccl
