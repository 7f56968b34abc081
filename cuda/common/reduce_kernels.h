// Host reduction math, shared by the CPU executor (exec/) and the copy-engine executor's host
// reductions (transport/ce/, when data is staged in host memory). Sources are combined in rank
// order, so every rank computes bitwise-identical results for the elements it owns.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "common/red_op.h"

namespace hoccl {

// Empty string when (dtype, op) is supported, else the reason.
std::string checkReducible(c10::ScalarType dtype, RedOp op);

// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... ; dst may alias any source.
// Avg and PremulSum reduce as Sum; apply postScale afterwards.
void reduceInto(void* dst, const void* const* srcs, int nsrc, int64_t count, c10::ScalarType dtype,
                RedOp op);

// dst[i] *= factor (Avg passes 1/world; integers truncate like integer division).
void postScale(void* dst, int64_t count, c10::ScalarType dtype, RedOp op, double factor, int world);

size_t elementSize(c10::ScalarType dtype);

}  // namespace hoccl
