// reduceInto's AVX-512 path: 32 elements a step, as two vectors of 16 floats (see reduce_vector.h
// for the contract).
#include "common/reduce_vector.h"

#if defined(__x86_64__)
// GCC 12 warns inside its own AVX-512 header, whose intrinsics start from a deliberately undefined
// vector; nothing here reads uninitialised data.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace hoccl {
namespace {

#define TARGET_AVX512 __attribute__((target("avx512f")))

constexpr int64_t kStep = 32;

// 32 elements as floats. For bfloat16 `a` holds the even elements and `b` the odd ones, which
// spares the widening and narrowing shuffles; the store puts them back in place.
struct Floats {
  __m512 a, b;
};

TARGET_AVX512 inline Floats load(const float* p) { return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)}; }

// A bfloat16 is the top half of a float: exact for every value, NaN payloads included.
TARGET_AVX512 inline Floats load(const c10::BFloat16* p) {
  const __m512i pairs = _mm512_loadu_si512(p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)),
          _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int32_t(0xFFFF0000))))};
}

TARGET_AVX512 inline Floats load(const c10::Half* p) {
  const auto* v = reinterpret_cast<const __m256i*>(p);
  return {_mm512_cvtph_ps(_mm256_loadu_si256(v)), _mm512_cvtph_ps(_mm256_loadu_si256(v + 1))};
}

TARGET_AVX512 inline void store(float* p, Floats f) {
  _mm512_storeu_ps(p, f.a);
  _mm512_storeu_ps(p + 16, f.b);
}

// c10::BFloat16(float) in the top 16 bits: round to nearest even on the bits (subnormals kept,
// overflow to inf), every NaN to 0x7FC0. vcvtneps2bf16 flushes subnormals and keeps NaN signs.
TARGET_AVX512 inline __m512i roundToBf16High(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC00000));
}

TARGET_AVX512 inline void store(c10::BFloat16* p, Floats f) {
  const __m512i even = _mm512_srli_epi32(roundToBf16High(f.a), 16);
  const __m512i odd = _mm512_and_si512(roundToBf16High(f.b), _mm512_set1_epi32(int32_t(0xFFFF0000)));
  _mm512_storeu_si512(p, _mm512_or_si512(even, odd));
}

// vcvtps2ph rounds as c10::Half(float) does everywhere but on NaN, whose payload it keeps while
// c10 writes sign | 0x7E00: NaN lanes become that sign's quiet NaN without payload first.
TARGET_AVX512 inline __m256i toHalf(__m512 v) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
  const __m512 quiet = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7FC00000)));
  return _mm512_cvtps_ph(_mm512_mask_mov_ps(v, nan, quiet), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

TARGET_AVX512 inline void store(c10::Half* p, Floats f) {
  auto* v = reinterpret_cast<__m256i*>(p);
  _mm256_storeu_si256(v, toHalf(f.a));
  _mm256_storeu_si256(v + 1, toHalf(f.b));
}

// Adds and multiplies with the accumulator as the first operand, pinned in asm because the compiler
// may swap the operands of a commutative intrinsic: of two NaNs x86 returns the first operand's
// (quieted), which is the portable path's rule.
TARGET_AVX512 inline __m512 addAccFirst(__m512 acc, __m512 x) {
  __m512 r;
  asm("vaddps %2, %1, %0" : "=v"(r) : "v"(acc), "vm"(x));
  return r;
}

TARGET_AVX512 inline __m512 mulAccFirst(__m512 acc, __m512 x) {
  __m512 r;
  asm("vmulps %2, %1, %0" : "=v"(r) : "v"(acc), "vm"(x));
  return r;
}

// min_ps(x, acc) is "x < acc ? x : acc": the portable comparison, with its NaN and signed-zero outcome.
template <RedOp Op>
TARGET_AVX512 inline __m512 combine(__m512 acc, __m512 x) {
  if constexpr (Op == RedOp::Sum) return addAccFirst(acc, x);
  else if constexpr (Op == RedOp::Product) return mulAccFirst(acc, x);
  else if constexpr (Op == RedOp::Min) return _mm512_min_ps(x, acc);
  else return _mm512_max_ps(x, acc);
}

template <class T, RedOp Op>
struct Avx512Kernel {
  TARGET_AVX512 static int64_t run(T* dst, const void* const* srcs, int nsrc, int64_t count) {
    int64_t i = 0;
    for (; i + kStep <= count; i += kStep) {
      Floats acc = load(static_cast<const T*>(srcs[0]) + i);
      for (int k = 1; k < nsrc; ++k) {
        const Floats x = load(static_cast<const T*>(srcs[k]) + i);
        acc = {combine<Op>(acc.a, x.a), combine<Op>(acc.b, x.b)};
      }
      store(dst + i, acc);
    }
    return i;
  }
};

}  // namespace

int64_t reduceVectorsAvx512(void* dst, const void* const* srcs, int nsrc, int64_t count,
                            c10::ScalarType dtype, RedOp op) {
  return vectorized<Avx512Kernel>(dst, srcs, nsrc, count, dtype, op);
}

}  // namespace hoccl
#pragma GCC diagnostic pop
#endif
