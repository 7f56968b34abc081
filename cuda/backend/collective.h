// One validated, ready-to-run collective: what the entry points hand to runCollective.
#pragma once
#include <chrono>
#include <vector>

#include "backend/process_group.h"

namespace hoccl {

struct ProcessGroupHOCCL::Collective {
  const char* opName;
  PlanRequest req;
  ExecContext ctx;
  std::vector<int64_t> sendBytes, recvBytes;  // all_to_all only
  std::chrono::steady_clock::time_point start, deadline;
  PhaseTimes times;  // filled when HOCCL_DEBUG is on (ctx.times points here)
};

}  // namespace hoccl
