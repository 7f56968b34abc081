#include "common/reduce_kernels.h"

#include "common/reduce_vector.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace hoccl {
namespace {

constexpr int64_t kBlock = 2048;  // elements per pass: the accumulator stays in L1

// Accumulator type: 16-bit floats accumulate in float for accuracy (and convert once).
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>,
                               float, T>;

// Of two NaNs, an add or multiply returns whichever the compiler made its first operand, so a NaN
// accumulator is kept explicitly (quieted, as arithmetic quiets it), the rule the vector paths
// follow too: every path writes the same NaN. A bitwise select, because the compiler will not
// vectorize a floating-point ?: while floating-point exceptions are observable.
template <typename A>
inline A keepNanAcc(A acc, A accQuieted, A result) {
  using Bits = std::conditional_t<sizeof(A) == 4, uint32_t, uint64_t>;
  Bits r, q;
  std::memcpy(&r, &result, sizeof r);
  std::memcpy(&q, &accQuieted, sizeof q);
  const Bits nan = Bits(0) - Bits(acc != acc);
  r = (q & nan) | (r & ~nan);
  std::memcpy(&result, &r, sizeof r);
  return result;
}

template <typename A, RedOp Op>
inline A combine(A a, A b) {
  if constexpr (Op == RedOp::Sum) {
    if constexpr (std::is_same_v<A, bool>) return a || b;
    else if constexpr (std::is_floating_point_v<A>) return keepNanAcc(a, a + a, a + b);
    else return a + b;
  } else if constexpr (Op == RedOp::Product) {
    if constexpr (std::is_same_v<A, bool>) return a && b;
    else if constexpr (std::is_floating_point_v<A>) return keepNanAcc(a, a * a, a * b);
    else return a * b;
  } else if constexpr (Op == RedOp::Min) {
    return b < a ? b : a;
  } else if constexpr (Op == RedOp::Max) {
    return a < b ? b : a;
  } else if constexpr (std::is_integral_v<A>) {
    if constexpr (Op == RedOp::BitAnd) return a & b;
    if constexpr (Op == RedOp::BitOr) return a | b;
    if constexpr (Op == RedOp::BitXor) return a ^ b;
  }
  return a;
}

// One source into the accumulator. Not inlined: inside the loop over sources, GCC -O3 fuses
// pairs of sources (unroll-and-jam) from four sources on and then no longer vectorizes.
template <typename T, RedOp Op>
__attribute__((noinline)) void accumulate(Acc<T>* acc, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = combine<Acc<T>, Op>(acc[i], static_cast<Acc<T>>(src[i]));
}

// Elements [first, count): a vector path leaves its tail here.
template <typename T, RedOp Op>
void reduceTyped(T* dst, const void* const* srcs, int nsrc, int64_t first, int64_t count) {
  using A = Acc<T>;
  A acc[kBlock];
  for (int64_t base = first; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    for (int64_t i = 0; i < n; ++i) acc[i] = static_cast<A>(s0[i]);
    for (int k = 1; k < nsrc; ++k) accumulate<T, Op>(acc, static_cast<const T*>(srcs[k]) + base, n);
    T* d = dst + base;
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(acc[i]);
  }
}

template <typename T>
void reduceDispatchOp(void* dst, const void* const* srcs, int nsrc, int64_t first, int64_t count,
                      RedOp op) {
  T* d = static_cast<T*>(dst);
  switch (op) {
    case RedOp::Sum:
    case RedOp::Avg:
    case RedOp::PremulSum:
      return reduceTyped<T, RedOp::Sum>(d, srcs, nsrc, first, count);
    case RedOp::Product:
      return reduceTyped<T, RedOp::Product>(d, srcs, nsrc, first, count);
    case RedOp::Min:
      return reduceTyped<T, RedOp::Min>(d, srcs, nsrc, first, count);
    case RedOp::Max:
      return reduceTyped<T, RedOp::Max>(d, srcs, nsrc, first, count);
    case RedOp::BitAnd:
      return reduceTyped<T, RedOp::BitAnd>(d, srcs, nsrc, first, count);
    case RedOp::BitOr:
      return reduceTyped<T, RedOp::BitOr>(d, srcs, nsrc, first, count);
    case RedOp::BitXor:
      return reduceTyped<T, RedOp::BitXor>(d, srcs, nsrc, first, count);
  }
}

template <typename T>
void scaleTyped(T* d, int64_t count, RedOp op, double factor, int world) {
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      if (op == RedOp::Avg) d[i] = static_cast<T>(d[i] / static_cast<T>(world));
      else d[i] = static_cast<T>(static_cast<double>(d[i]) * factor);
    } else {
      using A = Acc<T>;
      if (op == RedOp::Avg) d[i] = static_cast<T>(static_cast<A>(d[i]) / static_cast<A>(world));
      else d[i] = static_cast<T>(static_cast<A>(d[i]) * static_cast<A>(factor));
    }
  }
}

#define HOCCL_FOR_DTYPES(_) \
  _(float, Float)           \
  _(double, Double)         \
  _(c10::Half, Half)        \
  _(c10::BFloat16, BFloat16) \
  _(int8_t, Char)           \
  _(uint8_t, Byte)          \
  _(int16_t, Short)         \
  _(int32_t, Int)           \
  _(int64_t, Long)          \
  _(bool, Bool)

bool isFloating(c10::ScalarType t) { return c10::isFloatingType(t); }

void reducePortable(void* dst, const void* const* srcs, int nsrc, int64_t first, int64_t count,
                    c10::ScalarType dtype, RedOp op) {
  switch (dtype) {
#define HOCCL_CASE(T, N)                                             \
  case c10::ScalarType::N:                                           \
    return reduceDispatchOp<T>(dst, srcs, nsrc, first, count, op);
    HOCCL_FOR_DTYPES(HOCCL_CASE)
#undef HOCCL_CASE
    default:
      throw std::invalid_argument(std::string("hoccl: cannot reduce dtype ") + c10::toString(dtype));
  }
}

// How many leading elements the vector path of `isa` reduced (none for the portable one).
int64_t reduceVectorPrefix(ReduceIsa isa, void* dst, const void* const* srcs, int nsrc, int64_t count,
                           c10::ScalarType dtype, RedOp op) {
#if defined(__x86_64__)
  if (isa == ReduceIsa::Avx512) return reduceVectorsAvx512(dst, srcs, nsrc, count, dtype, op);
  if (isa == ReduceIsa::Avx2) return reduceVectorsAvx2(dst, srcs, nsrc, count, dtype, op);
#endif
  return 0;
}

void reduceWith(ReduceIsa isa, void* dst, const void* const* srcs, int nsrc, int64_t count,
                c10::ScalarType dtype, RedOp op) {
  if (count == 0) return;
  const int64_t done = reduceVectorPrefix(isa, dst, srcs, nsrc, count, dtype, op);
  if (done < count) reducePortable(dst, srcs, nsrc, done, count, dtype, op);
}

ReduceIsa detectBestIsa() {
  for (ReduceIsa isa : {ReduceIsa::Avx512, ReduceIsa::Avx2})
    if (cpuHasReduceIsa(isa)) return isa;
  return ReduceIsa::Portable;
}

}  // namespace

size_t elementSize(c10::ScalarType dtype) { return c10::elementSize(dtype); }

std::string checkReducible(c10::ScalarType dtype, RedOp op) {
  switch (dtype) {
#define HOCCL_CASE(T, N) case c10::ScalarType::N:
    HOCCL_FOR_DTYPES(HOCCL_CASE)
#undef HOCCL_CASE
    break;
    default:
      return std::string("dtype ") + c10::toString(dtype) + " is not supported for reductions";
  }
  bool bitwise = op == RedOp::BitAnd || op == RedOp::BitOr || op == RedOp::BitXor;
  if (bitwise && isFloating(dtype))
    return std::string(redOpName(op)) + " needs an integer or bool dtype, got " + c10::toString(dtype);
  if ((op == RedOp::Avg || op == RedOp::PremulSum) && dtype == c10::ScalarType::Bool)
    return std::string(redOpName(op)) + " is not defined for bool";
  return "";
}

const char* reduceIsaName(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::Portable: return "portable";
    case ReduceIsa::Avx2: return "avx2";
    case ReduceIsa::Avx512: return "avx512";
  }
  return "?";
}

bool cpuHasReduceIsa(ReduceIsa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();  // safe to repeat; needed if this runs before libgcc's own constructor
  // libgcc reports AVX and AVX-512 only when the OS also saves their registers.
  if (isa == ReduceIsa::Avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (isa == ReduceIsa::Avx512) return __builtin_cpu_supports("avx512f");
#endif
  return isa == ReduceIsa::Portable;
}

ReduceIsa bestReduceIsa() {
  static const ReduceIsa best = detectBestIsa();
  return best;
}

void reduceIntoOn(ReduceIsa isa, void* dst, const void* const* srcs, int nsrc, int64_t count,
                  c10::ScalarType dtype, RedOp op) {
  if (!cpuHasReduceIsa(isa))
    throw std::invalid_argument(std::string("hoccl: this CPU cannot run the ") + reduceIsaName(isa) +
                                " reduction path");
  reduceWith(isa, dst, srcs, nsrc, count, dtype, op);
}

void reduceInto(void* dst, const void* const* srcs, int nsrc, int64_t count, c10::ScalarType dtype,
                RedOp op) {
  reduceWith(bestReduceIsa(), dst, srcs, nsrc, count, dtype, op);
}

void postScale(void* dst, int64_t count, c10::ScalarType dtype, RedOp op, double factor, int world) {
  if (op != RedOp::Avg && op != RedOp::PremulSum) return;
  switch (dtype) {
#define HOCCL_CASE(T, N)                                                       \
  case c10::ScalarType::N:                                                     \
    if constexpr (!std::is_same_v<T, bool>)                                    \
      scaleTyped<T>(static_cast<T*>(dst), count, op, factor, world);           \
    return;
    HOCCL_FOR_DTYPES(HOCCL_CASE)
#undef HOCCL_CASE
    default:
      return;
  }
}

}  // namespace hoccl
