// reduceInto's AVX2 path, with F16C for half: 16 elements a step, as two vectors of 8 floats (see
// reduce_vector.h for the contract; reduce_avx512.cpp explains each conversion, done the same way).
#include "common/reduce_vector.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace hoccl {
namespace {

#define TARGET_AVX2 __attribute__((target("avx2,f16c")))

constexpr int64_t kStep = 16;

// 16 elements as floats; for bfloat16 `a` holds the even elements and `b` the odd ones.
struct Floats {
  __m256 a, b;
};

TARGET_AVX2 inline Floats load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }

TARGET_AVX2 inline Floats load(const c10::BFloat16* p) {
  const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xFFFF0000))))};
}

TARGET_AVX2 inline Floats load(const c10::Half* p) {
  const auto* v = reinterpret_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(v)), _mm256_cvtph_ps(_mm_loadu_si128(v + 1))};
}

TARGET_AVX2 inline void store(float* p, Floats f) {
  _mm256_storeu_ps(p, f.a);
  _mm256_storeu_ps(p + 8, f.b);
}

TARGET_AVX2 inline __m256i roundToBf16High(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
}

TARGET_AVX2 inline void store(c10::BFloat16* p, Floats f) {
  const __m256i even = _mm256_srli_epi32(roundToBf16High(f.a), 16);
  const __m256i odd = _mm256_and_si256(roundToBf16High(f.b), _mm256_set1_epi32(int32_t(0xFFFF0000)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_or_si256(even, odd));
}

TARGET_AVX2 inline __m128i toHalf(__m256 v) {
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  const __m256i sign = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(INT32_MIN));
  const __m256 quiet = _mm256_castsi256_ps(_mm256_or_si256(sign, _mm256_set1_epi32(0x7FC00000)));
  return _mm256_cvtps_ph(_mm256_blendv_ps(v, quiet, nan), _MM_FROUND_TO_NEAREST_INT);
}

TARGET_AVX2 inline void store(c10::Half* p, Floats f) {
  auto* v = reinterpret_cast<__m128i*>(p);
  _mm_storeu_si128(v, toHalf(f.a));
  _mm_storeu_si128(v + 1, toHalf(f.b));
}

TARGET_AVX2 inline __m256 addAccFirst(__m256 acc, __m256 x) {
  __m256 r;
  asm("vaddps %2, %1, %0" : "=x"(r) : "x"(acc), "xm"(x));
  return r;
}

TARGET_AVX2 inline __m256 mulAccFirst(__m256 acc, __m256 x) {
  __m256 r;
  asm("vmulps %2, %1, %0" : "=x"(r) : "x"(acc), "xm"(x));
  return r;
}

template <RedOp Op>
TARGET_AVX2 inline __m256 combine(__m256 acc, __m256 x) {
  if constexpr (Op == RedOp::Sum) return addAccFirst(acc, x);
  else if constexpr (Op == RedOp::Product) return mulAccFirst(acc, x);
  else if constexpr (Op == RedOp::Min) return _mm256_min_ps(x, acc);
  else return _mm256_max_ps(x, acc);
}

template <class T, RedOp Op>
struct Avx2Kernel {
  TARGET_AVX2 static int64_t run(T* dst, const void* const* srcs, int nsrc, int64_t count) {
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

int64_t reduceVectorsAvx2(void* dst, const void* const* srcs, int nsrc, int64_t count, c10::ScalarType dtype,
                          RedOp op) {
  return vectorized<Avx2Kernel>(dst, srcs, nsrc, count, dtype, op);
}

}  // namespace hoccl
#endif
