// The one argument of every hoccl reduction kernel, shared by reduce.cu (device side) and
// ce_reduce.cpp (the cuLaunchKernel side). Plain C layout: both compilers must agree on it.
#pragma once

#define HOCCL_REDUCE_MAX_SRCS 16
// The kernels' __launch_bounds__ and the block size the launcher uses (the driver model checks
// launches against it, as a driver does).
#define HOCCL_REDUCE_MAX_THREADS 512

enum HocclReduceOp { HOCCL_OP_SUM = 0, HOCCL_OP_PROD, HOCCL_OP_MIN, HOCCL_OP_MAX,
                     HOCCL_OP_BAND, HOCCL_OP_BOR, HOCCL_OP_BXOR };
enum HocclReduceScale { HOCCL_SCALE_NONE = 0, HOCCL_SCALE_DIV_WORLD, HOCCL_SCALE_MUL_FACTOR };
// How a launch uses `acc` (bits): past HOCCL_REDUCE_MAX_SRCS sources the launcher chains launches,
// and 16-bit floats must carry the running value between them in float, or they round per launch.
enum HocclReduceAcc { HOCCL_ACC_LOAD = 1,    // start from acc[i] instead of src[0][i]
                      HOCCL_ACC_STORE = 2 }; // leave the running value in acc[i], not dst

struct HocclReduceArgs {
  void* dst;                                 // may alias any source (elementwise)
  const void* src[HOCCL_REDUCE_MAX_SRCS];    // combined in index (rank) order
  long long count;                           // elements
  int nsrc;
  int op;                                    // HocclReduceOp
  int scale;                                 // HocclReduceScale, applied after rounding to T
  int world;                                 // divisor for HOCCL_SCALE_DIV_WORLD
  double factor;                             // multiplier for HOCCL_SCALE_MUL_FACTOR
  void* acc;                                 // running values in the accumulator type, or NULL
  int accMode;                               // HocclReduceAcc bits (0: acc unused)
};
