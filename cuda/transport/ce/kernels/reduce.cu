// hoccl's only SM work: the arithmetic of reductions, on data the copy engines already moved.
//
// Semantics match the host reductions in cuda/common/reduce_kernels.cpp exactly, so CUDA results equal
// CPU results bit for bit: sources combine in rank order, 16-bit floats accumulate in float and
// round once (also across chained launches: the running value stays in float in `acc`),
// AVG/PREMUL_SUM scale after rounding to T (integers divide like C++).
// The grid is bounded by the launcher (HOCCL_REDUCE_CTAS): a grid-stride loop lets a few CTAs
// cover any count, leaving the remaining SMs to the model.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "reduce_args.h"

namespace {

template <typename T> struct Acc { using type = T; };
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };

template <typename A, typename T> __device__ __forceinline__ A toAcc(T v) { return static_cast<A>(v); }
template <> __device__ __forceinline__ float toAcc<float, __half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float toAcc<float, __nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T, typename A> __device__ __forceinline__ T fromAcc(A v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half fromAcc<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 fromAcc<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename A> struct IsInt { static constexpr bool value = false; };
template <> struct IsInt<signed char> { static constexpr bool value = true; };
template <> struct IsInt<unsigned char> { static constexpr bool value = true; };
template <> struct IsInt<short> { static constexpr bool value = true; };
template <> struct IsInt<int> { static constexpr bool value = true; };
template <> struct IsInt<long long> { static constexpr bool value = true; };
template <> struct IsInt<bool> { static constexpr bool value = true; };

template <typename A>
__device__ __forceinline__ A combine(A a, A b, int op) {
  switch (op) {
    case HOCCL_OP_SUM: return a + b;
    case HOCCL_OP_PROD: return a * b;
    case HOCCL_OP_MIN: return b < a ? b : a;  // same expression (and NaN behaviour) as the host
    case HOCCL_OP_MAX: return a < b ? b : a;
    default: return a;
  }
}
template <>
__device__ __forceinline__ bool combine<bool>(bool a, bool b, int op) {
  switch (op) {
    case HOCCL_OP_SUM: case HOCCL_OP_BOR: return a || b;
    case HOCCL_OP_PROD: case HOCCL_OP_BAND: return a && b;
    case HOCCL_OP_MIN: return b < a ? b : a;
    case HOCCL_OP_MAX: return a < b ? b : a;
    case HOCCL_OP_BXOR: return a != b;
    default: return a;
  }
}
#define HOCCL_INT_COMBINE(A)                                                    \
  template <>                                                                   \
  __device__ __forceinline__ A combine<A>(A a, A b, int op) {                   \
    switch (op) {                                                               \
      case HOCCL_OP_SUM: return static_cast<A>(a + b);                          \
      case HOCCL_OP_PROD: return static_cast<A>(a * b);                         \
      case HOCCL_OP_MIN: return b < a ? b : a;                                  \
      case HOCCL_OP_MAX: return a < b ? b : a;                                  \
      case HOCCL_OP_BAND: return static_cast<A>(a & b);                         \
      case HOCCL_OP_BOR: return static_cast<A>(a | b);                          \
      case HOCCL_OP_BXOR: return static_cast<A>(a ^ b);                         \
      default: return a;                                                        \
    }                                                                           \
  }
HOCCL_INT_COMBINE(signed char)
HOCCL_INT_COMBINE(unsigned char)
HOCCL_INT_COMBINE(short)
HOCCL_INT_COMBINE(int)
HOCCL_INT_COMBINE(long long)

template <typename T, typename A>
__device__ __forceinline__ T scaleOne(T v, const HocclReduceArgs& a) {
  if (a.scale == HOCCL_SCALE_NONE) return v;
  if constexpr (IsInt<A>::value) {
    if (a.scale == HOCCL_SCALE_DIV_WORLD) return static_cast<T>(v / static_cast<T>(a.world));
    return static_cast<T>(static_cast<double>(v) * a.factor);
  } else {
    A x = toAcc<A>(v);
    if (a.scale == HOCCL_SCALE_DIV_WORLD) return fromAcc<T>(x / static_cast<A>(a.world));
    return fromAcc<T>(x * static_cast<A>(a.factor));
  }
}

template <typename T>
__device__ __forceinline__ void reduceAt(const HocclReduceArgs& a, long long i) {
  using A = typename Acc<T>::type;
  int k = 0;
  A acc = (a.accMode & HOCCL_ACC_LOAD) ? static_cast<const A*>(a.acc)[i]
                                       : toAcc<A>(static_cast<const T*>(a.src[k++])[i]);
  for (; k < a.nsrc; ++k) acc = combine<A>(acc, toAcc<A>(static_cast<const T*>(a.src[k])[i]), a.op);
  if (a.accMode & HOCCL_ACC_STORE) static_cast<A*>(a.acc)[i] = acc;
  else static_cast<T*>(a.dst)[i] = scaleOne<T, A>(fromAcc<T>(acc), a);
}

// Grid-stride loop, 4 independent elements per thread per trip for memory-level parallelism.
template <typename T>
__device__ void reduceBody(const HocclReduceArgs& a) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < a.count; i += 4 * stride) {
#pragma unroll
    for (int u = 0; u < 4; ++u) reduceAt<T>(a, i + u * stride);
  }
  for (; i < a.count; i += stride) reduceAt<T>(a, i);
}

}  // namespace

// One entry point per dtype, named after c10::ScalarType (hoccl_reduce_<Name>).
#define HOCCL_REDUCE_KERNEL(T, NAME) \
  extern "C" __global__ void __launch_bounds__(HOCCL_REDUCE_MAX_THREADS) hoccl_reduce_##NAME(HocclReduceArgs a) { reduceBody<T>(a); }
HOCCL_REDUCE_KERNEL(float, Float)
HOCCL_REDUCE_KERNEL(double, Double)
HOCCL_REDUCE_KERNEL(__half, Half)
HOCCL_REDUCE_KERNEL(__nv_bfloat16, BFloat16)
HOCCL_REDUCE_KERNEL(signed char, Char)
HOCCL_REDUCE_KERNEL(unsigned char, Byte)
HOCCL_REDUCE_KERNEL(short, Short)
HOCCL_REDUCE_KERNEL(int, Int)
HOCCL_REDUCE_KERNEL(long long, Long)
HOCCL_REDUCE_KERNEL(bool, Bool)
