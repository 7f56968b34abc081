// torch.ops.hoccl.all_reduce_: an in-place all_reduce outside c10d's per-call path
// (direct_allreduce.cpp says why).
#pragma once

#include "backend/process_group.h"

namespace hoccl {

// The handle torch.ops.hoccl.all_reduce_ names this group by (the same one on every call): a
// ProcessGroupHOCCL, or a group spanning hosts.
int64_t directHandle(const c10::intrusive_ptr<c10d::Backend>& pg);

}  // namespace hoccl
