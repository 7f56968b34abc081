// The x86-64 vector paths of reduceInto. Each is compiled for its instruction set through function
// target attributes only (never a file-wide -m flag or target pragma, which would also compile c10's
// inline Half conversions for that set), so the extension loads on any x86-64 and reduceInto picks
// a path at run time. Each returns how many leading elements it reduced: a multiple of its vector
// width, or 0 for a dtype/op pair it leaves to the portable path. The bits written are the portable
// path's: sources combined in rank order in float, no reassociation, c10's rounding back.
#pragma once
#include "common/reduce_kernels.h"

namespace hoccl {

#if defined(__x86_64__)
int64_t reduceVectorsAvx2(void* dst, const void* const* srcs, int nsrc, int64_t count, c10::ScalarType dtype,
                          RedOp op);
int64_t reduceVectorsAvx512(void* dst, const void* const* srcs, int nsrc, int64_t count,
                            c10::ScalarType dtype, RedOp op);
#endif

// Kernel<T, Op>::run(T* dst, srcs, nsrc, count) for the pairs the vector paths cover: float,
// bfloat16 and half with sum (Avg and PremulSum reduce as sum), product, min and max.
template <template <class, RedOp> class Kernel, class T>
int64_t vectorizedByOp(void* dst, const void* const* srcs, int nsrc, int64_t count, RedOp op) {
  T* d = static_cast<T*>(dst);
  switch (op) {
    case RedOp::Sum:
    case RedOp::Avg:
    case RedOp::PremulSum:
      return Kernel<T, RedOp::Sum>::run(d, srcs, nsrc, count);
    case RedOp::Product:
      return Kernel<T, RedOp::Product>::run(d, srcs, nsrc, count);
    case RedOp::Min:
      return Kernel<T, RedOp::Min>::run(d, srcs, nsrc, count);
    case RedOp::Max:
      return Kernel<T, RedOp::Max>::run(d, srcs, nsrc, count);
    default:
      return 0;
  }
}

template <template <class, RedOp> class Kernel>
int64_t vectorized(void* dst, const void* const* srcs, int nsrc, int64_t count, c10::ScalarType dtype,
                   RedOp op) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return vectorizedByOp<Kernel, float>(dst, srcs, nsrc, count, op);
    case c10::ScalarType::BFloat16:
      return vectorizedByOp<Kernel, c10::BFloat16>(dst, srcs, nsrc, count, op);
    case c10::ScalarType::Half:
      return vectorizedByOp<Kernel, c10::Half>(dst, srcs, nsrc, count, op);
    default:
      return 0;
  }
}

}  // namespace hoccl
