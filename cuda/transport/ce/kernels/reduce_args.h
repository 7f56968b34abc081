// The one argument of every hoccl reduction kernel, shared by reduce.cu (device side) and
// ce_reduce.cpp (the cuLaunchKernel side). Plain C layout: both compilers must agree on it.
#pragma once

#define HOCCL_REDUCE_MAX_SRCS 16

enum HocclReduceOp { HOCCL_OP_SUM = 0, HOCCL_OP_PROD, HOCCL_OP_MIN, HOCCL_OP_MAX,
                     HOCCL_OP_BAND, HOCCL_OP_BOR, HOCCL_OP_BXOR };
enum HocclReduceScale { HOCCL_SCALE_NONE = 0, HOCCL_SCALE_DIV_WORLD, HOCCL_SCALE_MUL_FACTOR };

struct HocclReduceArgs {
  void* dst;                                 // may alias any source (elementwise)
  const void* src[HOCCL_REDUCE_MAX_SRCS];    // combined in index (rank) order
  long long count;                           // elements
  int nsrc;
  int op;                                    // HocclReduceOp
  int scale;                                 // HocclReduceScale, applied after rounding to T
  int world;                                 // divisor for HOCCL_SCALE_DIV_WORLD
  double factor;                             // multiplier for HOCCL_SCALE_MUL_FACTOR
};
