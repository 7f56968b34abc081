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
// Runs on the widest vector instruction set this CPU has (see ReduceIsa).
void reduceInto(void* dst, const void* const* srcs, int nsrc, int64_t count, c10::ScalarType dtype,
                RedOp op);

// Instruction sets reduceInto can run on. Float, bfloat16 and half with sum, product, min and max
// have vector paths; every other pair, and the tail after the last full step, take the portable one.
// All give the portable path's bits, so ranks on different CPUs still agree.
enum class ReduceIsa : int8_t { Portable, Avx2, Avx512 };

const char* reduceIsaName(ReduceIsa isa);  // "portable", "avx2", "avx512"
bool cpuHasReduceIsa(ReduceIsa isa);       // "avx2" means AVX2 and F16C
ReduceIsa bestReduceIsa();                 // what reduceInto uses on this CPU

// reduceInto on a chosen instruction set, for tests and benchmarks that compare them;
// throws std::invalid_argument when this CPU lacks it.
void reduceIntoOn(ReduceIsa isa, void* dst, const void* const* srcs, int nsrc, int64_t count,
                  c10::ScalarType dtype, RedOp op);

// dst[i] *= factor (Avg passes 1/world; integers truncate like integer division).
void postScale(void* dst, int64_t count, c10::ScalarType dtype, RedOp op, double factor, int world);

size_t elementSize(c10::ScalarType dtype);

}  // namespace hoccl
